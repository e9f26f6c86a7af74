#!/usr/bin/env python3
"""lf_kto_step.py — memplan --trainer kto --loss hf against LLaMA-Factory 0.9.5's KTO step on the CPU.

  python3 bench/accuracy/lf_kto_step.py [--memplan ./memplan] [--lf-src DIR] [--trl-src DIR]
                                       [--out FILE.md] [--rows-out FILE] [--select 0,2] [--no-1b]
                                       [--detail]

LLaMA-Factory (`stage: kto`) runs its own CustomKTOTrainer (llamafactory 0.9.5
train/kto/trainer.py) over TRL 0.24's KTOTrainer class (LLaMA-Factory 0.9.5 pins trl <= 0.24:
METADATA, extras/misc.py check_version), whose compute_loss (trl 0.24.0 trainer/kto_trainer.py
:1477-1499) calls self.get_batch_loss_metrics: CustomKTOTrainer's.  That step is what this bench
runs:
  get_batch_loss_metrics (train/kto/trainer.py:220-268): concatenated_forward on the policy, then
  compute_reference_log_probs (:201-218: the reference copy, or the policy with peft's adapter
  disabled, under torch.no_grad), TRL 0.24's kto_loss (kto_trainer.py:1119-1194), the ftx term
  (pref_ftx 0: none), the metrics (nansum of the chosen / rejected logits);
  concatenated_forward (:183-199): forward on the batch, then forward on the KL sequences under
  torch.no_grad while the batch's fp32 logits are held, then the chosen and rejected logits picked
  by kto_tags (boolean indexing: copies);
  forward (:148-181): nested_detach(batch, clone=True) (trainer_utils.py), model(...).logits
  .to(torch.float32), get_batch_logps (trainer_utils.py).
Every one of those functions runs as its source has it: importing llamafactory needs omegaconf and
more (absent here), and trl 0.24 is not installed (trl 1.16 is), so they are read out of the
wheels' source files (--lf-src: the unpacked llamafactory 0.9.5 wheel's llamafactory/, --trl-src:
the unpacked trl 0.24.0 wheel's trl/, each from `pip download ... --no-deps`) with ast and executed
unchanged, bound to a stand-in for the trainer holding what they read (FinetuningArguments'
defaults: pref_beta 0.1, kto_chosen_weight 1.0, kto_rejected_weight 1.0, pref_ftx 0; loss_type
"kto", calculate_KL True as CustomKTOTrainer.__init__ sets them; _peft_has_been_casted_to_bf16
False; one process: gather_for_metrics returns its input).

The reference as LLaMA-Factory builds it (train/kto/workflow.py, trainer_utils.py
create_ref_model): finetuning_type lora (the adapter disabled), full (the model loaded again,
frozen, in the compute dtype: the policy's here).  The model, the adapters, dropout, checkpointing
and bf16-amp as lf_dpo_step.py (its prepare).  The batch is LLaMA-Factory's
KTODataCollatorWithPadding's (data/collator.py:568-608): input_ids, attention_mask, labels (-100
over the prompt), kl_input_ids, kl_attention_mask, kl_labels (each example's prompt with the next
example's completion, data/processor/feedback.py), kto_tags (desirable, undesirable alternately),
no padding.  Two steps (loss.backward(), AdamW foreach, zero_grad) under InplaceTracker; step 2's
peak against `memplan estimate CONFIG --trainer kto --loss hf ... --optimizer adamw --workspace 0
--use-cache off --json`.  CUDA's contiguous copy before log_softmax: lf_dpo_step.cuda_softmax_copy.

Rows go to bench/accuracy/rows/lf_kto_step.jsonl (tests/replay_accuracy.py replays them: figures
peak, ref_forward_peak -- the reference's two forwards on what the policy holds --, and
policy_step_peak -- the policy's forwards (the batch, then the KL sequences) before the reference's,
and its backward).  Not part of make test.  About 5 minutes on 2 cores.
"""
import collections.abc
import contextlib
import os
import sys
import types
import warnings
from collections import defaultdict
from typing import Any, Literal, Optional, Union

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
import peft  # noqa: E402

import rowlib  # noqa: E402
import orpo_step  # noqa: E402  (OrpoTracker)
import lf_dpo_step  # noqa: E402  (prepare, read_functions, traced, two_steps, run_table, cli)

TRL_SRC = "/tmp/trl024/trl"

# (model, finetune, checkpoint, examples, seq, prompt tokens, precision)
SETTINGS = [("tiny", "full", "none", 4, 256, 128, "bf16"), ("tiny", "full", "layers", 4, 256, 128, "bf16"),
            ("tiny", "lora", "layers", 4, 256, 128, "bf16"), ("tiny", "lora", "none", 4, 256, 128, "bf16"),
            ("tiny", "lora", "layers", 4, 256, 128, "bf16-amp"), ("tiny", "full", "none", 1, 512, 8, "bf16"),
            ("tiny", "full", "layers", 8, 128, 64, "bf16"),
            ("1b", "full", "layers", 2, 256, 128, "bf16"), ("1b", "lora", "layers", 2, 256, 128, "bf16-amp")]


def lf_functions(lf_src, trl_src):
    """LLaMA-Factory's get_batch_logps, nested_detach and CustomKTOTrainer's methods, TRL 0.24's
    KTOTrainer.kto_loss, compute_loss and store_metrics: {name: function}."""
    ns = {"torch": torch, "F": F, "IGNORE_INDEX": -100, "Optional": Optional, "Union": Union, "Any": Any,
          "Literal": Literal, "Mapping": collections.abc.Mapping, "nullcontext": contextlib.nullcontext,
          "override": lambda f: f, "PreTrainedModel": torch.nn.Module, "nn": torch.nn,
          "autocast": torch.autocast}
    read = lf_dpo_step.read_functions
    out = read(os.path.join(lf_src, "train/trainer_utils.py"), ("get_batch_logps", "nested_detach"), ns)
    out.update(read(os.path.join(lf_src, "train/kto/trainer.py"),
                    ("forward", "concatenated_forward", "compute_reference_log_probs", "get_batch_loss_metrics"), ns))
    out.update(read(os.path.join(trl_src, "trainer/kto_trainer.py"), ("kto_loss", "compute_loss", "store_metrics"), ns))
    return out


class Stub:
    """What the methods read of the trainer (CustomKTOTrainer.__init__'s settings, FinetuningArguments'
    defaults, one process)."""

    def __init__(self, fns, ref):
        for name in ("forward", "concatenated_forward", "compute_reference_log_probs", "get_batch_loss_metrics",
                     "kto_loss", "compute_loss", "store_metrics"):
            setattr(self, name, types.MethodType(fns[name], self))
        self.ref_model = ref
        self.beta, self.desirable_weight, self.undesirable_weight, self.ftx_gamma = 0.1, 1.0, 1.0, 0.0
        self.loss_type, self.calculate_KL = "kto", True
        self._peft_has_been_casted_to_bf16 = False
        self._stored_metrics = defaultdict(lambda: defaultdict(list))
        self.args = types.SimpleNamespace(device=torch.device("cpu"))
        self.accelerator = types.SimpleNamespace(device=torch.device("cpu"), unwrap_model=lambda m: m,
                                                 gather_for_metrics=lambda t: t, is_main_process=True)


def lf_kto_inputs(vocab, n, seq, prompt):
    """KTODataCollatorWithPadding's batch, no padding: each KL row is the example's prompt with the
    next example's completion (feedback.py: kl_response rotated by one), kto_tags alternate."""
    p = torch.randint(0, vocab, (n, prompt))
    comp = torch.randint(0, vocab, (n, seq - prompt))
    ids = torch.cat([p, comp], 1)
    kl = torch.cat([p, comp.roll(1, 0)], 1)
    lab, kl_lab = ids.clone(), kl.clone()
    lab[:, :prompt] = -100
    kl_lab[:, :prompt] = -100
    tags = torch.tensor([i % 2 == 0 for i in range(n)])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": lab, "kl_input_ids": kl,
            "kl_attention_mask": torch.ones_like(kl), "kl_labels": kl_lab, "kto_tags": tags}


def lf_kto_step(fns, config, ft, ckpt, n, seq, prompt, prec, detail=False):
    """Two steps; step 2's figures: {peak, peak_at, fwd_peak, bwd_peak, ref_peak, policy_fwd_peak, kl_peak, ...}."""
    model, ref, opt = lf_dpo_step.prepare(config, ft, ckpt, prec)
    if lf_dpo_step.fits(model, ref):
        return {"skipped": lf_dpo_step.fits(model, ref)}
    stub = Stub(fns, ref)
    tr = orpo_step.OrpoTracker(snapshot=detail)
    # the reference's moment (compute_reference_log_probs; box[2]: the policy's forwards before it)
    # and the policy's KL forward's (its forward with prefix "kl_" in its concatenated_forward)
    ref_box, kl_box = [0, "", 0], [0, "", 0]
    stub.compute_reference_log_probs = lf_dpo_step.traced(tr, stub.compute_reference_log_probs, ref_box)
    inner_fwd = stub.forward
    traced_kl = lf_dpo_step.traced(tr, inner_fwd, kl_box)

    def forward(model_, batch, prefix=""):
        policy_kl = prefix == "kl_" and not ref_box[2]
        return (traced_kl if policy_kl else inner_fwd)(model_, batch, prefix)

    def step(second):
        ref_box[2] = 0
        stub.forward = forward if second else inner_fwd
        stub._stored_metrics.clear()
        return stub.compute_loss(model, inputs)
    inputs = lf_kto_inputs(config["vocab_size"], n, seq, prompt)
    return lf_dpo_step.two_steps(tr, model, ref, opt, inputs, step,
                                 lambda: {"ref_peak": ref_box[0], "ref_peak_at": ref_box[1],
                                          "policy_fwd_peak": ref_box[2], "kl_peak": kl_box[0], "kl_peak_at": kl_box[1]},
                                 detail)


def main():
    a = lf_dpo_step.cli(__doc__, "lf_kto_step", TRL_SRC)
    torch.set_num_threads(1)
    fns = lf_functions(a.lf_src, a.trl_src)
    versions = rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                   peft=peft.__version__, llamafactory="0.9.5 (source)",
                                   trl="0.24.0 (source: kto_loss, compute_loss)", tensors="real, CPU")
    lf_dpo_step.run_table(a, versions, SETTINGS, lambda *x: lf_kto_step(fns, *x),
                          lambda *x: lf_dpo_step.memplan_args(*x, trainer="kto"), "lf_kto_step",
                          "examples", ("policy fwd+KL", "policy_fwd_peak"))


if __name__ == "__main__":
    main()
