"""py_trainer.py: MemplanCallback (python/memplan/integrations/transformers.py) in real transformers
Trainer and TRL SFTTrainer runs, on the CPU, on a tiny random Llama (hidden 64, 2 layers).

Usage: python3 -B tests/py_trainer.py [./memplan]   (from the repository root; make test-long runs it)

* Trainer + peft LoRA (r 4, alpha 8, q_proj,v_proj), micro-batch 4 x accumulation 2, gradient
  checkpointing, optim adamw_torch: the callback's plan is that run's (batch, accumulation,
  checkpointing, optimizer, LoRA, the live model's parameter and trainable counts, which torch counts
  here) and its peak is the one `memplan check` gives for the same run written out by hand as
  options; the step runs;
* QLoRA (a bitsandbytes NF4 base loaded on the CPU, prepare_model_for_kbit_training): planned as
  qlora from the model's quantization_config, with the parameters the 4-bit weights stand for;
* full fine-tuning told a GPU too small (vram=): MemplanDoesNotFit before any step (no
  on_step_begin, global_step 0), with the change that fits (same global batch, a smaller
  micro-batch); with that change the callback passes and the step runs; on_oom="warn" warns and
  the step runs;
* settings memplan cannot plan are refused before any step (label_smoothing_factor: memplan's
  refusal; an optimizer that is not args.optim's; modules_to_save, which memplan's trainable count
  lacks), and warned with on_unsupported="warn";
* TRL SFTTrainer with peft_config (all-linear): max_length, TRL's chunked loss and its default
  checkpointing are planned; too small a GPU raises before any step; packing=True is planned
  padding-free.

torch, transformers and peft (and TRL for its part) must import; a library that is absent is
reported as "skip" and does not fail the run (CI does not install them).
"""
import os
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, failures, have, skip  # noqa: E402

MEMPLAN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "memplan"))
os.environ["MEMPLAN_BIN"] = MEMPLAN


missing = [m for m in ("torch", "transformers", "peft") if not have(m)]
if missing:
    skip("%s absent: MemplanCallback is not run in a Trainer" % ", ".join(missing))
    print("0 failed")
    sys.exit(0)

import shutil  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import (LlamaConfig, LlamaForCausalLM, PrinterCallback, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments)

import memplan  # noqa: E402
from memplan.integrations.transformers import MemplanCallback, MemplanDoesNotFit, MemplanUnsupported  # noqa: E402

OUT = tempfile.mkdtemp(prefix="memplan-trainer-")
SEQ = 64
CFG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           vocab_size=256, max_position_embeddings=256)


def tiny(seed=0, **kw):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**dict(CFG, **kw)))


class Data(torch.utils.data.Dataset):
    def __init__(self, seq=SEQ):
        g = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(0, CFG["vocab_size"], (seq,), generator=g) for _ in range(16)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i].clone()}


class Steps(TrainerCallback):
    """counts the steps that began"""

    def __init__(self):
        self.n = 0

    def on_step_begin(self, args, state, control, **kw):
        self.n += 1


def targs(**kw):
    base = dict(output_dir=OUT, report_to="none", max_steps=1, save_strategy="no", logging_strategy="no",
                disable_tqdm=True, dataloader_num_workers=0)
    base.update(kw)
    return TrainingArguments(**base)


def counts(model):
    """the model's parameters and trainable parameters, as torch holds them"""
    ps = list(model.parameters())
    return sum(p.numel() for p in ps), sum(p.numel() for p in ps if p.requires_grad)


def train(model, args, cb, **kw):
    """(the exception train() raised or None, the steps that began, global_step)"""
    steps = Steps()
    t = Trainer(model=model, args=args, train_dataset=kw.pop("data", Data()), callbacks=[cb, steps], **kw)
    t.remove_callback(PrinterCallback)  # the metrics dict on stdout
    try:
        t.train()
        return None, steps.n, t.state.global_step
    except Exception as e:  # the callback's exceptions are what the cases check
        return e, steps.n, t.state.global_step


# ---- Trainer + LoRA: the plan of the actual arguments ----------------------------------------------------
lines = []
lora = get_peft_model(tiny(), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                         task_type="CAUSAL_LM"))
n_all, n_train = counts(lora)
cb = MemplanCallback(gpu="a100-40gb", seq=SEQ, log=lines.append, keep_dir=os.path.join(OUT, "lora"))
err, began, step = train(lora, targs(per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                     gradient_checkpointing=True, optim="adamw_torch"), cb)
r = cb.report
check(err is None and began == 1 and step == 1, "Trainer + LoRA on a100-40gb: fits, the step runs (%s)" % err)
if r is not None:
    c, ft = r.config, r.config.finetune
    check(isinstance(r, memplan.CheckReport) and r.fits and c.batch == 4 and c.grad_accumulation and
          cb._setting(r, "grad-accum", "") == "2" and c.seq_len == SEQ and c.checkpoint == "layers" and
          c.optimizer == "adamw" and c.precision == "fp32" and ft.mode == "lora" and ft.lora_r == 4 and
          ft.lora_alpha == 8 and ft.lora_targets == "q_proj,v_proj",
          "Trainer + LoRA: planned batch 4 x 2, seq %d, checkpoint layers, adamw (adamw_torch), fp32 (fp32 weights, "
          "no bf16), LoRA r 4 alpha 8 on q_proj,v_proj" % SEQ)
    check((r.model.params, r.model.trainable_params) == (n_all, n_train),
          "Trainer + LoRA: memplan's model has torch's counts: %d parameters, %d trainable" % (n_all, n_train))
    # the same run written out by hand as memplan's options (from the TrainingArguments above)
    hand = memplan.check(os.path.join(OUT, "lora", "llama"), batch=4, grad_accum=2, seq=SEQ, precision="fp32",
                         optimizer="adamw", checkpoint="layers", finetune="lora", lora_r=4, lora_alpha=8,
                         lora_targets="q_proj,v_proj", use_cache=False, attention="sdpa", gpu="a100-40gb")
    check(hand.memory.peak_device_bytes == r.memory.peak_device_bytes and
          hand.memory.peak_allocated_bytes == r.memory.peak_allocated_bytes,
          "Trainer + LoRA: the peak (%d B) is memplan check's for the options written by hand"
          % r.memory.peak_device_bytes)
    check(len(lines) == 1 and "batch 4 x 2 accumulated" in lines[0] and "fits" in lines[0],
          "Trainer + LoRA: one line logged: %s" % (lines[0][:110] if lines else "none"))
    check(cb.argv and "--recipe" in cb.argv and os.path.isfile(cb.argv[cb.argv.index("--recipe") + 1]),
          "Trainer + LoRA: keep_dir keeps the command line's files: " + " ".join(cb.argv[1:4]))

# ---- QLoRA: a bitsandbytes 4-bit base (bitsandbytes runs on the CPU) ---------------------------------------------
if not have("bitsandbytes"):
    skip("bitsandbytes absent: no QLoRA run")
else:
    from peft import prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig

    plain = tiny()
    n_plain = counts(plain)[0]  # the weights the 4-bit model stands for, counted by torch before quantizing
    plain.save_pretrained(os.path.join(OUT, "tinyllama"))
    q = LlamaForCausalLM.from_pretrained(os.path.join(OUT, "tinyllama"), device_map="cpu", quantization_config=
                                         BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                            bnb_4bit_use_double_quant=True,
                                                            bnb_4bit_compute_dtype=torch.bfloat16))
    q = get_peft_model(prepare_model_for_kbit_training(q), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj",
                                                                                                        "v_proj"],
                                                                         task_type="CAUSAL_LM"))
    q_train = counts(q)[1]  # the adapters (fp32 tensors: torch's numel is their count)
    cb = MemplanCallback(gpu="t4", seq=SEQ, log=lines.append)
    err, began, _ = train(q, targs(per_device_train_batch_size=2, gradient_checkpointing=True), cb)
    r = cb.report
    ft = r.config.finetune if r else None
    check(err is None and began == 1 and ft is not None and ft.mode == "qlora" and ft.base_quant == "bnb-nf4" and
          ft.double_quant is True and (r.model.params, r.model.trainable_params) == (n_plain + q_train, q_train),
          "QLoRA (bitsandbytes NF4, double quant, from the model's quantization_config): planned as qlora on %d "
          "parameters (%d before quantizing + %d adapters), the step runs (%s)"
          % (n_plain + q_train, n_plain, q_train, err))

# ---- too small a GPU: raised before any step, with the change that fits --------------------------------------
full_args = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, optim="adamw_torch")
model = tiny()
# a GPU between micro-batch 1's peak and micro-batch 4's (usable = 95% of it)
def need(k):
    """what the level that decides needs: the allocated peak, or the simulated device's reserved + context"""
    return max(k.peak_device_bytes, k.device_bytes or 0)


p1, p4 = (need(memplan.check(os.path.join(OUT, "lora", "llama"), batch=b, seq=SEQ, precision="fp32", use_cache=False,
                             gpu="a100-40gb").check) for b in (1, 4))
vram = int((p1 + p4) / 2 / 0.95)
err, began, step = train(model, targs(**full_args), MemplanCallback(vram=vram, seq=SEQ, log=lines.append))
check(isinstance(err, MemplanDoesNotFit) and began == 0 and step == 0,
      "full, vram %d B (between micro-batch 1's peak and 4's): MemplanDoesNotFit before any step (%d steps began)"
      % (vram, began))
if isinstance(err, MemplanDoesNotFit):
    rec = err.suggestion.recommendation if err.suggestion else None
    check(not err.report.fits and rec is not None and rec.micro_batch * rec.grad_accum == 8 and rec.micro_batch < 4
          and "per_device_train_batch_size=%d" % rec.micro_batch in str(err),
          "full: the message says what fits: %s" % str(err).split("Would fit: ")[-1][:100])
    if rec is not None:
        err, began, step = train(model, targs(per_device_train_batch_size=rec.micro_batch,
                                              gradient_accumulation_steps=rec.grad_accum, optim="adamw_torch"),
                                 MemplanCallback(vram=vram, seq=SEQ, log=lines.append))
        check(err is None and began == 1, "full, with the change: the callback passes and the step runs (%s)" % err)
n = len(lines)
err, began, step = train(model, targs(**full_args),
                         MemplanCallback(vram=vram, seq=SEQ, on_oom="warn", log=lines.append))
check(err is None and began == 1 and any("does not fit" in x for x in lines[n:]),
      "full, on_oom='warn': a warning, and the step runs")

# ---- what memplan cannot plan: refused before any step, or warned -------------------------------------------
err, began, _ = train(model, targs(label_smoothing_factor=0.1, **full_args), MemplanCallback(gpu="a100-40gb", seq=SEQ))
check(isinstance(err, MemplanUnsupported) and err.code == memplan.EXIT_INPUT and "label_smoothing_factor" in str(err)
      and began == 0, "label_smoothing_factor 0.1: refused before any step (memplan's exit 3): %s" % str(err)[-80:])
n = len(lines)
err, began, _ = train(model, targs(label_smoothing_factor=0.1, **full_args),
                      MemplanCallback(gpu="a100-40gb", seq=SEQ, on_unsupported="warn", log=lines.append))
check(err is None and began == 1 and any("label_smoothing_factor" in x for x in lines[n:]),
      "label_smoothing_factor, on_unsupported='warn': warned, the step runs")
sgd = torch.optim.SGD(model.parameters(), lr=0.1)
err, began, _ = train(model, targs(**full_args), MemplanCallback(gpu="a100-40gb", seq=SEQ), optimizers=(sgd, None))
check(isinstance(err, MemplanUnsupported) and "SGD" in str(err) and began == 0,
      "an SGD passed to the Trainer with optim adamw_torch: refused before any step: %s" % str(err)[30:130])
cb = MemplanCallback(gpu="a100-40gb", seq=SEQ, options={"optimizer": "sgd"}, log=lines.append)
err, began, _ = train(model, targs(**full_args), cb, optimizers=(torch.optim.SGD(model.parameters(), lr=0.1), None))
check(err is None and cb.report is not None and cb.report.config.optimizer == "sgd" and began == 1,
      "the same with options={'optimizer': 'sgd'}: planned with sgd, the step runs")
saved = get_peft_model(tiny(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"],
                                          task_type="CAUSAL_LM"))
err, began, _ = train(saved, targs(**full_args), MemplanCallback(gpu="a100-40gb", seq=SEQ))
check(isinstance(err, MemplanUnsupported) and "trainable" in str(err) and began == 0,
      "LoRA with modules_to_save=['lm_head'] (memplan's trainable count lacks it): refused before any step: %s"
      % str(err)[30:150])

# ---- TRL's SFTTrainer ---------------------------------------------------------------------------------------
if not (have("trl") and have("datasets") and have("tokenizers")):
    skip("trl, datasets or tokenizers absent: SFTTrainer is not run")
else:
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    tk = Tokenizer(models.WordLevel({"t%d" % i: i for i in range(CFG["vocab_size"])}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="t0", eos_token="t1", unk_token="t0")
    g = torch.Generator().manual_seed(0)
    ds = Dataset.from_dict({"input_ids": [torch.randint(2, CFG["vocab_size"], (48,), generator=g).tolist()
                                          for _ in range(16)]})

    def sft(cb, **kw):
        steps = Steps()
        args = SFTConfig(output_dir=OUT, report_to="none", max_steps=1, save_strategy="no", logging_strategy="no",
                         disable_tqdm=True, bf16=False, per_device_train_batch_size=2, max_length=96, **kw)
        t = SFTTrainer(model=tiny(tie_word_embeddings=True), args=args, train_dataset=ds, processing_class=tok,
                       peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"),
                       callbacks=[cb, steps])
        t.remove_callback(PrinterCallback)
        try:
            t.train()
            return None, steps.n, t
        except Exception as e:
            return e, steps.n, t

    cb = MemplanCallback(gpu="t4", log=lines.append)
    err, began, t = sft(cb)
    r = cb.report
    n_all, n_train = counts(t.model)
    check(err is None and began == 1 and r is not None and r.fits, "SFTTrainer + LoRA on a t4: fits, the step runs (%s)"
          % err)
    if r is not None:
        c = r.config
        check(c.seq_len == 96 and c.loss == "chunked-nll" and c.checkpoint == "layers" and c.batch == 2 and
              c.precision == "fp32" and c.recipe.format == "trl" and c.finetune.mode == "lora" and
              c.finetune.lora_r == 8 and
              c.finetune.lora_targets == "down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj",
              "SFTTrainer: planned max_length 96, TRL's chunked loss (loss_type nll), its default checkpointing, "
              "batch 2, LoRA r 8 on every Linear (%s)" % c.finetune.lora_targets)
        check((r.model.params, r.model.trainable_params) == (n_all, n_train),
              "SFTTrainer: memplan's model has torch's counts (tied embeddings): %d parameters, %d trainable"
              % (n_all, n_train))
    err, began, t = sft(MemplanCallback(vram="300MiB"))
    check(isinstance(err, MemplanDoesNotFit) and began == 0 and t.state.global_step == 0 and
          err.suggestion is not None and err.suggestion.recommendation is None and "Nothing fits" in str(err),
          "SFTTrainer on 300 MiB (less than the CUDA context): MemplanDoesNotFit before any step, nothing fits")
    cb = MemplanCallback(gpu="t4")
    err, began, _ = sft(cb, packing=True)
    pk = cb.report.config.packing if cb.report else None
    # TRL 1.16: packing=True (strategy bfd) turns padding_free on: one row of batch x max_length tokens
    check(err is None and began == 1 and pk == "padding-free",
          "SFTTrainer packing=True: planned padding-free (config.packing %s), the step runs (%s)" % (pk, err))

shutil.rmtree(OUT, ignore_errors=True)
print("%d failed" % len(failures))
sys.exit(1 if failures else 0)
