#!/usr/bin/env python3
"""peft_step.py — memplan's fine-tuning figures against transformers + peft + bitsandbytes on the CPU.

  python3 bench/accuracy/peft_step.py lora [--quick] [--only NAME,...] [--skip K] [--out FILE.md]
      (--only also takes config paths, *.json: e.g. a multimodal checkpoint's config, built as its
      *ForConditionalGeneration class and stepped on text only; LoRA all-linear and q_proj,v_proj)
      For each config and setting (LoRA rank and targets, base fp32 / amp-bf16 / bf16,
      checkpointing none / layers), the model is built with transformers, wrapped with
      peft.get_peft_model(LoraConfig(r, lora_alpha=2r, lora_dropout=0, task_type=CAUSAL_LM)),
      and trained for two steps under FakeTensorMode on the CPU (no memory used): forward with
      labels, backward, AdamW (foreach) over the trainable parameters, zero_grad(set_to_none).
      A TorchDispatchMode counts live storages (512-byte rounded, as CUDA's allocator counts
      memory_allocated; parameters, buffers and optimizer state registered) and gives step
      2's peak; saved_tensors_hooks give what autograd saves (no checkpointing).  Compared
      with `memplan estimate --finetune lora ... --workspace 0 --json`: trainable params
      (exact), saved bytes (sum of layers[].activation_bytes), step peak.  Both sides read the
      same config file, dropout set to 0 (torch_step.load_config: CPU dropout masks are not
      CUDA's).  CPU autocast differs from CUDA autocast on the ops CUDA runs in fp32
      (docs/memory-facts.md#autocast): the bytes CUDA keeps beyond the CPU are listed per row,
      op by op, by torch_step.cuda_only_bytes (GPT-2's gelu_new pow), and "diff vs CUDA" compares
      memplan with torch + those bytes; the full fine-tuning row of each setting is the base model.

  python3 bench/accuracy/peft_step.py lora-packing [--only NAME,...] [--out FILE.md]
      Packed batches (memplan --packing / --padding-free) at the realistic LoRA setting: bf16,
      LoRA all-linear r16, checkpointed layers, Llama-3.2-1B and Llama-3-8B (4 layers), 1 x 8192
      and 2 x 4096, SDPA and eager; torch_step.train_steps' packing (position_ids passed,
      transformers' own find_packed_sequence_indices).  Results: bench/accuracy/packing_results.md.

  python3 bench/accuracy/peft_step.py recompute [--only NAME,...] [--out FILE.md] [--memplan PATH]
      [--show N] [--no-save]
      Checkpointed steps whose peak is the last block's recompute and backward (issue 26 item 5,
      docs/checkpointing.md#early-stop): Llama-shaped configs with a vocabulary of 1,000
      (RECOMPUTE_CONFIGS: hidden 1024, and Llama-2-7B's widths), LoRA all-linear r16 with
      lora_dropout 0 and 0.05, and full fine-tuning, bf16 / amp-bf16 / fp32, under transformers'
      non-reentrant checkpointing; dropout runs CUDA's kernel (torch_step._dropout_cuda_kernel).
      --show N prints the N largest storages live at torch's peak; the rows go to
      rows/peft_step.jsonl unless --no-save.  Results: bench/accuracy/recompute_results.md.

  python3 bench/accuracy/peft_step.py bf16-amp [--only NAME,...] [--out FILE.md] [--memplan PATH]
      --precision bf16-amp (bf16 weights, bf16 autocast, fp32 adapters): GPT-2, Qwen2-0.5B and
      Llama-3.2-1B at 4 layers, full / LoRA r16 default targets / all-linear, checkpointing none
      and layers; CPU fake-tensor steps, and the forward again on fake CUDA tensors under CUDA's
      autocast lists (bf16_amp_bench): the saved bytes CUDA keeps beyond the CPU, measured.
      Results: bench/accuracy/bf16_amp_results.md.

  python3 bench/accuracy/peft_step.py seq2seq-lora [--out FILE.md] [--memplan PATH]
      The same for T5 (t5-small, flan-t5-base; every layer): AutoModelForSeq2SeqLM with peft's
      default LoRA (q, v; SEQ_2_SEQ_LM), batch 4, encoder 512, labels of 128 (memplan
      --target-seq 128), CUDA's memory-efficient SDPA for T5's position-bias mask
      (torch_step.CUDA_FLOAT_MASK) and T5's CUDA-only bytes (torch_step.t5_cuda_only_bytes).

  python3 bench/accuracy/peft_step.py images [--out FILE.md] [--memplan PATH] [--only NAME,...]
      Gemma 3 steps with images (memplan --images N) and the same rows text-only (images_bench):
      the processor's batch through Gemma3ForConditionalGeneration on fake tensors, full and LoRA,
      checkpointing none / layers, the shrunk config, a Gemma-3-4B-shaped one and Gemma-3-4B itself.  Results:
      bench/accuracy/images_results.md; rows to rows/peft_step.jsonl.

  python3 bench/accuracy/peft_step.py qwenvl [--out FILE.md] [--memplan PATH] [--only NAME,...]
      Qwen2-VL / Qwen2.5-VL steps with images: flattened patches, image_grid_thw and M-RoPE
      position ids (qwen_image_inputs) on fake tensors, images of two sizes beside the text-only
      step; Qwen2-VL's also planned by memplan (--images 1 --image-size HxW), rows to
      rows/peft_step.jsonl; Qwen2.5-VL's torch side only (memplan refuses --images for it).
      Results: bench/accuracy/qwenvl_images_results.md.

  python3 bench/accuracy/peft_step.py params [CONFIG ...]
      Trainable and total parameters as peft counts them (get_nb_trainable_parameters) for
      each config (default: models/hf/*.json), built on the meta device as its
      architectures[0], wrapped with LoraConfig(r=16, lora_alpha=32, task_type from the head)
      with peft's default target_modules and with "all-linear"; memplan's figures beside.
      Where peft has no default for the model type it refuses (it needs target_modules) and
      memplan assumes all-linear: the row says so.  Prints the rows of tests/test_finetune.c's
      table too (expected values from peft).

  python3 bench/accuracy/peft_step.py qlora-bytes [CONFIG ...]
      QLoRA base storage as bitsandbytes really holds it: every Linear that
      transformers' bnb integration replaces (all nn.Linear but those its
      get_keys_to_not_convert and _keep_in_fp32_modules name: lm_head; a multimodal
      checkpoint's vision tower and projector included) is quantized
      with bitsandbytes.functional.quantize_4bit (nf4, blocksize 64, double quant) on
      the CPU, one real tensor per distinct shape, and the bytes of every tensor of
      its quant state are summed (packed weight, absmax, offset, second-level absmax,
      both code tables).  Non-quantized parameters (embeddings, norms, lm_head, biases)
      are counted in fp32, as after peft's prepare_model_for_kbit_training.  Prints
      memplan's weights_bytes for `--finetune qlora` beside it, less its fp32 adapters.

  python3 bench/accuracy/peft_step.py qlora-step [--trl]
      A real QLoRA step on the CPU (bitsandbytes 0.50 runs Linear4bit forward and backward
      there): a small Llama (hidden 256, 2 layers, vocab 1024) is saved with random weights,
      loaded with BitsAndBytesConfig(nf4, double quant), prepare_model_for_kbit_training,
      get_peft_model(r 16, q_proj/v_proj), trained 3 steps with AdamW on real tensors; the
      live-storage tracker (parameters and every quant-state tensor registered) gives step
      2's peak, compared with `memplan estimate --finetune qlora`.  Real tensors: the model is
      kept small.
      --trl: the step as TRL 1.16's SFTTrainer runs it (all-linear adapters): its cast of the
      quantized model's trainable parameters to bf16 (sft_trainer.py:905-911) and its chunked LM
      head (loss_heads.py's), against memplan's `--loss chunked-nll`.

Needs torch, transformers, peft, bitsandbytes (pip).  Not part of `make test`.
"""
import json
import os
import subprocess
import contextlib
import sys
import warnings
from collections import Counter

warnings.filterwarnings("ignore")


def start_measured_step(tr, opt):
    """The measured step starts here: AdamW's step counters are not memory a CUDA run keeps
    (they live on the host), and the peak restarts from what is live now."""
    import gc
    import torch
    for st in opt.state.values():
        if "step" in st and isinstance(st["step"], torch.Tensor):
            tr.forget(st["step"])
    gc.collect()
    tr.peak, tr.peak_at = tr.cur, "step-start"


def meta_model(path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def bnb_linear_bytes(out_f, in_f, double_quant=True, quant_type="nf4"):
    import torch
    import bitsandbytes.functional as F
    w = torch.randn(out_f, in_f, dtype=torch.bfloat16)
    packed, st = F.quantize_4bit(w, blocksize=64, compress_statistics=double_quant, quant_type=quant_type)
    tensors = [packed, st.absmax, st.code]
    if st.nested:
        tensors += [st.offset, st.state2.absmax, st.state2.code]
    return sum(t.numel() * t.element_size() for t in tensors)


def qlora_bytes(path):
    """The bytes of a bitsandbytes NF4 base: the Linears transformers' quantizer converts (every
    nn.Linear that get_keys_to_not_convert and the class's _keep_in_fp32_modules do not name,
    matched by should_convert_module: quantizers/base.py, quantizer_bnb_4bit.py), each as
    bitsandbytes packs it, the rest fp32.  A multimodal config is built as its own class (its
    vision tower and projector quantized too)."""
    import json
    import torch
    import transformers
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module
    with open(path) as f:
        d = json.load(f)
    if "ForConditionalGeneration" in (d.get("architectures") or [""])[0]:
        with torch.device("meta"):
            m = getattr(transformers, d["architectures"][0])(transformers.AutoConfig.for_model(**d))
    else:
        m = meta_model(path)
    skip = get_keys_to_not_convert(m) + list(getattr(m, "_keep_in_fp32_modules", None) or [])
    shapes = Counter()
    other = 0
    quantized_ids = set()
    for name, mod in m.named_modules():
        if isinstance(mod, torch.nn.Linear) and should_convert_module(name, skip):
            shapes[(mod.out_features, mod.in_features)] += 1
            quantized_ids.add(id(mod.weight))
    seen = set()
    for p in m.parameters():
        if id(p) in quantized_ids or id(p) in seen:
            continue
        seen.add(id(p))
        other += p.numel() * 4
    q = sum(n * bnb_linear_bytes(o, i) for (o, i), n in shapes.items())
    return q + other, q, other, dict(shapes)


# ---- LoRA step under FakeTensorMode ------------------------------------------------------------

def _trackers():
    """torch_step's LiveTracker (live storages, 512-byte rounded, peak and where) and
    SavedTracker (distinct storages autograd saves)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_step import LiveTracker, SavedTracker
    return LiveTracker, SavedTracker


class CudaAutocast:
    """torch.autocast("cuda", bfloat16) on a machine without a GPU: torch.autocast disables
    itself there (torch/amp/autocast_mode.py: "CUDA is not available"), so the same switches it
    sets are set directly (set_autocast_enabled/dtype, the nesting count, the cache cleared on the
    outermost exit).  Fake tensors on the "cuda" device then dispatch through AutocastCUDA: CUDA's
    own op lists (aten/src/ATen/autocast_mode.cpp), not the CPU's."""

    def __enter__(self):
        import torch
        self.prev = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", torch.bfloat16)
        torch.autocast_increment_nesting()
        return self

    def __exit__(self, *exc):
        import torch
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", self.prev[0])
        torch.set_autocast_dtype("cuda", self.prev[1])


def flash_sdpa_on_fake_cuda(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
    """SDPA on fake CUDA tensors: its backend choice asks the device (none here) and falls back to
    the math path, which a GPU with bf16 would not run for a causal, unmasked, equal-width call;
    such calls go to aten's flash kernel (meta function: out, fp32 logsumexp (b, a, s)), with
    autocast's cast of the inputs done here (SDPA is on CUDA's lower-precision list; the aten op
    is not).  Other calls keep torch's choice (rowlib: GPT-2, Qwen2, Llama are checked)."""
    import torch
    # enable_gqa: flash takes k, v with fewer heads as they are (sdp_utils.cpp check_grouped_query_attention)
    flash = attn_mask is None and query.shape[-1] == value.shape[-1] <= 256
    if not flash:
        return _SDPA_BEFORE(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, **kw)
    if torch.is_autocast_enabled("cuda"):
        dt = torch.get_autocast_dtype("cuda")
        query, key, value = query.to(dt), key.to(dt), value.to(dt)
    return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
                                                              scale=scale)[0]


_SDPA_BEFORE = None


def autocast_for(precision, device):
    """amp-bf16 (fp32 weights) and bf16-amp (bf16 weights) run the forward under bf16 autocast."""
    import torch
    if precision not in ("amp-bf16", "bf16-amp"):
        return None
    return CudaAutocast() if device == "cuda" else torch.autocast(device, dtype=torch.bfloat16)


class _ImageMerge:
    """Gemma 3's image step under FakeTensorMode: get_placeholder_mask's count check reads a value
    (torch_compilable_check: .item(), data-dependent under fake tensors) and masked_scatter's
    backward runs masked_select (an output size read from the mask).  Inside this context the check
    is skipped and Tensor.masked_scatter is an autograd Function that allocates what ATen's does
    (tools/autograd/derivatives.yaml masked_scatter: saves the mask; the output a new tensor of
    self's shape; backward grad.masked_fill(mask, 0) and masked_scatter_backward's masked_select,
    a new tensor of the source's elements, viewed to its shape).  CUDA's masked_select also makes a
    (selected, 3) int64 nonzero index (index with a bool mask), which the CPU does not: not
    measured here (memplan counts it as a backward transient)."""

    def __enter__(self):
        import torch
        import transformers.models.gemma3.modeling_gemma3 as g3

        class MaskedScatter(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, mask, src):
                ctx.save_for_backward(mask)
                ctx.src_shape = src.shape
                return torch.empty_like(x)

            @staticmethod
            def backward(ctx, g):
                (mask,) = ctx.saved_tensors
                return g.masked_fill(mask, 0), None, torch.empty(ctx.src_shape, dtype=g.dtype, device=g.device)

        import transformers.models.mistral3.modeling_mistral3 as m3

        class Sizes:  # Mistral3Model.get_image_features' split sizes: (as_tensor(image_sizes) // ratio)
            def __init__(self, v):  # .prod(dim=-1).tolist(), a (images, 2) int64 tensor read as numbers,
                self.v = v          # which a fake tensor cannot give: the same arithmetic on the list

            def __floordiv__(self, k):
                return Sizes([[x // k for x in r] for r in self.v])

            def prod(self, dim=-1):
                return Sizes([r[0] * r[1] for r in self.v])

            def tolist(self):
                return list(self.v)

        class TorchShim:  # m3's torch, but as_tensor of a list of (h, w) pairs (image_sizes)
            def __getattr__(self, name):
                return getattr(torch, name)

            @staticmethod
            def as_tensor(x, *a, **k):
                return Sizes([list(r) for r in x]) if isinstance(x, list) else torch.as_tensor(x, *a, **k)

        import transformers.models.qwen2_vl.modeling_qwen2_vl as q2
        import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl as q25
        import transformers.models.llama4.modeling_llama4 as l4
        self.mods = (g3, m3, q2, q25, l4)  # (each module's own name for the count check)
        self.before = ([mod.torch_compilable_check for mod in self.mods], torch.Tensor.masked_scatter, m3.torch)
        for mod in self.mods:
            mod.torch_compilable_check = lambda *a, **k: None
        torch.Tensor.masked_scatter = lambda t, mask, src: MaskedScatter.apply(t, mask, src)
        m3.torch = TorchShim()
        return self

    def __exit__(self, *exc):
        import torch
        import transformers.models.mistral3.modeling_mistral3 as m3
        for mod, f in zip(self.mods, self.before[0]):
            mod.torch_compilable_check = f
        torch.Tensor.masked_scatter = self.before[1]
        m3.torch = self.before[2]


def image_tokens(d, size=None):
    """The text positions one image takes in seq: Gemma 3's mm_tokens_per_image; Mistral 3's
    PixtralProcessor writes rows x (columns + 1) tokens (processing_pixtral.py: an [IMG] per merged
    patch, [IMG_BREAK] after each row, [IMG_END] last) for an image of size (h, w) pixels, rows =
    h / (patch_size x spatial_merge_size)."""
    if d.get("model_type") == "llama4":
        return llama4_layout(d["vision_config"], size)[2]
    if d.get("model_type") != "mistral3":
        return d.get("mm_tokens_per_image", 256)
    vc = d["vision_config"]
    unit = vc.get("patch_size", 16) * d.get("spatial_merge_size", 2)
    h, w = size or (vc.get("image_size", 1024),) * 2
    return (h // unit) * (w // unit + 1)


def _llama4_fit():
    """transformers' own get_factors, find_supported_resolutions and get_best_fit
    (models/llama4/image_processing_llama4.py), run from its source: the module imports torchvision,
    which this machine lacks."""
    import ast
    import collections
    import functools
    import torch
    import transformers.models.llama4 as pkg
    src = open(os.path.join(os.path.dirname(pkg.__file__), "image_processing_llama4.py")).read()
    want = ("get_factors", "find_supported_resolutions", "get_best_fit")
    body = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name in want]
    ns = {"torch": torch, "defaultdict": collections.defaultdict, "lru_cache": functools.lru_cache,
          "SizeDict": object}
    exec(compile(ast.Module(body=body, type_ignores=[]), "image_processing_llama4.py", "exec"), ns)
    return ns["find_supported_resolutions"], ns["get_best_fit"]


def llama4_layout(vc, size=None, max_patches=16):
    """Llama4ImageProcessor's tiles for an image of size (h, w) pixels (default: one tile of
    image_size), from transformers' own find_supported_resolutions / get_best_fit (the class
    defaults max_patches 16, resize_to_max_canvas False), and Llama4Processor._prompt_split_image's
    layout: returns (tiles incl. the global one, image tokens, tokens in the sequence)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from transformers.image_utils import SizeDict
    find_supported_resolutions, get_best_fit = _llama4_fit()
    T = vc["image_size"] if isinstance(vc, dict) else vc.image_size
    p = vc["patch_size"] if isinstance(vc, dict) else vc.patch_size
    ratio = vc.get("pixel_shuffle_ratio", 0.5) if isinstance(vc, dict) else vc.pixel_shuffle_ratio
    h, w = size or (T, T)
    with unset_fake_temporarily():
        res = torch.tensor(find_supported_resolutions(max_patches, SizeDict(height=T, width=T)))
        canvas = get_best_fit((h, w), res)
        rows, cols = int(canvas[0]) // T, int(canvas[1]) // T
    n = rows * cols
    per = int((T // p) ** 2 // int(round(1.0 / ratio ** 2)))
    tiles = n + 1 if n > 1 else 1
    seq = 3 + per * tiles + (n if n > 1 else 0)
    return tiles, per * tiles, seq


def llama4_image_inputs(cfg, batch, seq, images, dtype, size, device="cpu"):
    """A Llama4Processor's batch: per image its tokens (llama4_layout; the patch tokens
    image_token_id, the separators, start, <|image|> and end other ids), pixel_values (batch x images
    x tiles, channels, image_size, image_size) in the model's dtype (aspect_ratios is no model
    input)."""
    import torch
    vc = cfg.vision_config
    tiles, img_tok, per_image = llama4_layout(vc, size)
    n = images * per_image
    if n + 1 > seq:
        raise ValueError("%d image positions exceed seq %d" % (n, seq))
    tid = cfg.image_token_id
    ids = torch.randint(0, tid, (batch, seq), device=device)
    one = torch.full((per_image,), tid + 1, dtype=ids.dtype, device=device)
    one[1:1 + img_tok] = tid
    ids[:, 1:1 + n] = one.repeat(images)
    pv = torch.randn(batch * images * tiles, vc.num_channels, vc.image_size, vc.image_size, dtype=dtype,
                     device=device)
    return ids, pv


def mistral3_image_inputs(cfg, batch, seq, images, dtype, size, device="cpu"):
    """A PixtralProcessor's batch for Mistral 3: per image rows x (columns + 1) tokens, rows x columns
    of them image_token_id; pixel_values (batch x images, channels, h, w) in the model's dtype;
    image_sizes (a list of (h, w): PatchMerger and get_image_features read them as numbers, which a
    fake tensor cannot give; the processor's (batch x images, 2) int64 tensor is tracked beside)."""
    import torch
    vc = cfg.vision_config
    unit = vc.patch_size * cfg.spatial_merge_size
    h, w = size or (vc.image_size, vc.image_size)
    rows, cols = h // unit, w // unit
    n = images * rows * (cols + 1)
    if n > seq:
        raise ValueError("%d image tokens exceed seq %d" % (n, seq))
    tid = cfg.image_token_id
    ids = torch.randint(tid + 1, cfg.get_text_config().vocab_size, (batch, seq), device=device)
    one = torch.full((rows, cols + 1), tid, dtype=ids.dtype, device=device)
    one[:, cols] = tid + 1  # [IMG_BREAK] / [IMG_END]: not image tokens
    ids[:, 1:1 + n] = one.flatten().repeat(images)
    pv = torch.randn(batch * images, vc.num_channels, h, w, dtype=dtype, device=device)
    sizes = torch.tensor([[h, w]] * (batch * images), dtype=torch.long, device=device)
    return ids, [(h, w)] * (batch * images), pv, sizes


class _Grid:
    """image_grid_thw as Qwen2-VL / Qwen2.5-VL read it under fake tensors: get_image_features'
    split sizes, image_grid_thw.prod(-1) // spatial_merge_size**2 .tolist() (a value read, which a
    fake tensor cannot give), from the rows it was made of."""

    def __init__(self, rows):
        self.rows = rows

    def prod(self, dim):
        return _Grid([r[0] * r[1] * r[2] for r in self.rows])

    def __floordiv__(self, k):
        return _Grid([r // k for r in self.rows])

    def tolist(self):
        return list(self.rows)

    def __len__(self):
        return len(self.rows)


class _CuSeqlens:
    """cu_seqlens as the vision attention's non-flash path reads it (VisionAttention.forward:
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]; torch.split(..., lengths.tolist(), dim=2)): the
    attention spans' lengths, known on the host."""

    def __init__(self, lens):
        self.lens = lens

    def __getitem__(self, k):
        return self

    def __sub__(self, o):
        return self

    def tolist(self):
        return list(self.lens)


class _QwenVision:
    """Qwen2-VL / Qwen2.5-VL's vision tower under FakeTensorMode (transformers 5.24 vision_utils.py):
    get_vision_position_ids (the (patches, 2) int64 h/w ids), get_vision_attention_seqlens (one span
    per image) and Qwen2.5-VL's get_vision_window_index (the (patches / merge^2,) int64 reorder index
    and the window spans) compute on values; here the tensors they return are allocated with their
    real shapes (fake, tracked) and the spans come from the real index computed on the host, outside
    the fake mode, from the real image_grid_thw."""

    def __init__(self, rows, merge, window_size=0, patch=14):
        self.rows, self.merge, self.window_size, self.patch = rows, merge, window_size, patch

    def __enter__(self):
        import torch
        import transformers.vision_utils as vu
        import transformers.models.qwen2_vl.modeling_qwen2_vl as q2
        import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl as q25
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        rows = self.rows
        n = sum(t * h * w for t, h, w in rows)
        spans = [t * h * w for t, h, w in rows]
        with unset_fake_temporarily():
            win = []
            if self.window_size:
                _, cu = vu.get_vision_window_index(torch.tensor(rows), self.merge, self.window_size, self.patch)
                cu = cu.tolist()
                win = [b - a for a, b in zip(cu[:-1], cu[1:])]
        unit = self.merge * self.merge
        self.before = [(mod, {k: getattr(mod, k) for k in ("get_vision_position_ids", "get_vision_attention_seqlens",
                                                            "get_vision_window_index") if hasattr(mod, k)})
                       for mod in (q2, q25)]
        for mod in (q2, q25):
            mod.get_vision_position_ids = lambda g, s, include_temporal=False, kwargs=None: torch.zeros(
                n, 2, dtype=torch.long)
            mod.get_vision_attention_seqlens = lambda g, c, merge_temporal=False, kwargs=None: (_CuSeqlens(spans), None)
        q25.get_vision_window_index = lambda g, spatial_merge_size, window_size, patch_size, kwargs=None: (
            torch.zeros(n // unit, dtype=torch.long), _CuSeqlens(win))
        return self

    def __exit__(self, *exc):
        for mod, saved in self.before:
            for k, f in saved.items():
                setattr(mod, k, f)


def qwen_image_inputs(cfg, model, batch, seq, images, size, dtype, device="cpu"):
    """A Qwen2-VL / Qwen2.5-VL processor's batch for images of size (height, width) pixels (multiples
    of patch_size x spatial_merge_size, as Qwen2VLImageProcessor's smart_resize makes them): each
    image is (h/p) x (w/p) patches, pixel_values (patches of every image, C x temporal_patch_size x
    p x p) in the model's dtype, image_grid_thw rows [1, h/p, w/p], (h/p)(w/p)/merge^2 image tokens
    per image in input_ids (after a BOS), mm_token_type_ids 1 on them, and the (3, batch, seq) M-RoPE
    position ids get_rope_index makes from them (computed here on real tensors, outside the fake
    mode, then passed in, as a collator that precomputes them would).  Returns ids, position_ids,
    pixel_values, the grid rows."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    vc = cfg.vision_config
    p, m, tp = vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size
    H, W = size
    if H % (p * m) or W % (p * m):
        raise ValueError("image size %dx%d is not a multiple of %d" % (H, W, p * m))
    rows = [[1, H // p, W // p]] * (batch * images)
    per = (H // p) * (W // p) // (m * m)
    if images * per + 1 > seq:
        raise ValueError("%d image tokens exceed seq %d" % (images * per, seq))
    with unset_fake_temporarily():
        ids = torch.randint(0, min(cfg.image_token_id, cfg.get_text_config().vocab_size), (batch, seq))
        ids[:, 1:1 + images * per] = cfg.image_token_id
        tt = (ids == cfg.image_token_id).int()
        pos, _ = type(model.model).get_rope_index(model.model, ids, image_grid_thw=torch.tensor(rows),
                                                  attention_mask=None, mm_token_type_ids=tt)
    ids, pos = ids.clone().to(device), pos.clone().to(device)  # (fake copies, tracked)
    pv = torch.randn(len(rows) * (H // p) * (W // p), vc.in_channels * tp * p * p, dtype=dtype, device=device)
    return ids, pos, pv, rows


def image_inputs(cfg, batch, seq, images, dtype, device="cpu"):
    """A Gemma 3 processor's batch: input_ids with images x mm_tokens_per_image image tokens per row
    (after a BOS), token_type_ids 1 on them (Gemma3Processor's mm_token_type_ids), pixel_values
    (batch x images, channels, image_size, image_size) in the model's dtype."""
    import torch
    vc, T = cfg.vision_config, cfg.mm_tokens_per_image
    n = images * T
    if n > seq:
        raise ValueError("%d image tokens exceed seq %d" % (n, seq))
    ids = torch.randint(0, min(cfg.image_token_id, cfg.get_text_config().vocab_size), (batch, seq), device=device)
    ids[:, 1:1 + n] = cfg.image_token_id
    tt = (ids == cfg.image_token_id).long()
    pv = torch.randn(batch * images, vc.num_channels, vc.image_size, vc.image_size, dtype=dtype, device=device)
    return ids, tt, pv


def mllama_image_inputs(cfg, batch, seq, images, dtype, device="cpu"):
    """MllamaProcessor's batch for `images` images a sample (image_processing_mllama.py
    pad_batches_and_tiles: every image padded to max_image_tiles tiles, whatever its size, so the
    size changes values, never a shape): pixel_values (batch, images, tiles, C, image_size,
    image_size) in the model's dtype, aspect_ratio_ids (batch, images) and aspect_ratio_mask
    (batch, images, tiles) int64, and processing_mllama.py's cross_attention_mask (batch, seq,
    images, tiles) int64; one <|image|> token a sample (its id, image_token_index)."""
    import torch
    vc = cfg.vision_config
    t = vc.max_num_tiles
    ids = torch.randint(0, cfg.text_config.vocab_size, (batch, seq), device=device)
    pv = torch.randn(batch, images, t, vc.num_channels, vc.image_size, vc.image_size, dtype=dtype, device=device)
    ar_ids = torch.ones(batch, images, dtype=torch.long, device=device)
    ar_mask = torch.ones(batch, images, t, dtype=torch.long, device=device)
    xmask = torch.ones(batch, seq, images, t, dtype=torch.long, device=device)
    return ids, pv, ar_ids, ar_mask, xmask


def torch_lora_step(cfg_path, batch, seq, precision, ckpt, r, targets, full=False, dropout=0.0, live_at_peak=False,
                    packing="", attention="sdpa", device="cpu", images=0, freeze_vision=False, image_size=None):
    import gc
    import torch
    import transformers
    import transformers.masking_utils
    import peft
    from torch._subclasses.fake_tensor import FakeTensorMode
    # fake tensors look like tracing to transformers, which would build a 4-D mask; packed rows
    # (torch_step.train_steps' packing) keep transformers' own function and pass position_ids
    Live, Saved = _trackers()
    import torch_step
    transformers.masking_utils.find_packed_sequence_indices = (
        torch_step._FIND_PACKED if packing else (lambda position_ids: None))
    with open(cfg_path) as f:
        d = json.load(f)  # the config memplan reads too (dropout already off: bench_config)
    torch_step.llama4_output_fix(d)
    cfg = transformers.AutoConfig.for_model(**d)
    cfg._attn_implementation = attention
    dtype = torch.bfloat16 if precision in ("bf16", "bf16-amp") else torch.float32
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    # Built on the meta device (peft's adapter dtype/device moves cannot swap fake parameters),
    # then given fake CPU storages.
    arch = getattr(transformers, (d.get("architectures") or [""])[0], None)
    mm = arch is not None and arch.__name__.endswith("ForConditionalGeneration") and "vision_config" in d
    with torch.device("meta"):  # a multimodal checkpoint: its own class (a text-only step, no pixel_values)
        model = arch._from_config(cfg, dtype=dtype) if mm else transformers.AutoModelForCausalLM.from_config(
            cfg, dtype=dtype)
        if not full:
            kw = dict(r=r, lora_alpha=2 * r, lora_dropout=dropout, task_type="CAUSAL_LM")
            if targets:
                kw["target_modules"] = targets if targets == "all-linear" else targets.split(",")
            model = peft.get_peft_model(model, peft.LoraConfig(**kw))
    with fake:
        model.to_empty(device=device)
        (model.get_base_model() if not full else model).tie_weights()  # to_empty unties them
    model.train()
    qwen = images and d.get("model_type") in ("qwen2_vl", "qwen2_5_vl")
    if freeze_vision:  # the frozen tower: requires_grad False on the vision tower and the projector
        base = model if full else model.get_base_model()
        tower = (list(model.get_base_model().model.visual.parameters()) if not full else
                 list(model.model.visual.parameters())) if qwen else \
            list(base.model.vision_model.parameters()) + list(base.model.multi_modal_projector.parameters()) \
            if d.get("model_type") == "mllama" else \
            list(base.vision_model.parameters()) + list(base.multi_modal_projector.parameters()) \
            if d.get("model_type") == "llama4" else \
            list(model.model.vision_tower.parameters()) + list(model.model.multi_modal_projector.parameters())
        for p in tower:
            p.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    tr = Live(snapshot=live_at_peak) if live_at_peak else Live()
    saved = Saved(list(model.parameters()) + list(model.buffers()))
    res = {"trainable": n_trainable}
    with fake, tr:
        if ckpt == "layers+sac":  # TRL's own wrapper: its SDPA policy as the context_fn (sac_step.py)
            from trl.models import enable_selective_activation_checkpointing
            enable_selective_activation_checkpointing(model)
        if ckpt in ("layers", "layers+sac"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for p in model.parameters():
            tr.add(p, "param")
        for b in model.buffers():
            tr.add(b, "buffer")
        global _SDPA_BEFORE
        if device == "cuda" and _SDPA_BEFORE is None:
            _SDPA_BEFORE = torch.nn.functional.scaled_dot_product_attention
            torch.nn.functional.scaled_dot_product_attention = flash_sdpa_on_fake_cuda
        shape = (1, batch * seq) if packing == "padding-free" else (batch, seq)
        kw = {}
        vision = contextlib.nullcontext
        if qwen:  # Qwen2-VL / Qwen2.5-VL: flattened patches, image_grid_thw, M-RoPE position ids
            base = model if full else model.get_base_model()
            ids, kw["position_ids"], kw["pixel_values"], rows = qwen_image_inputs(
                cfg, base, batch, seq, images, image_size, dtype, device)
            kw["image_grid_thw"] = _Grid(rows)
            tr.add(kw["position_ids"], "position_ids")
            tr.add(kw["pixel_values"], "pixel_values")
            vc = cfg.vision_config
            vision = lambda: _QwenVision(rows, vc.spatial_merge_size, getattr(vc, "window_size", 0) or 0,
                                         vc.patch_size)
        elif images and cfg.model_type == "llama4":  # Llama4Processor's inputs
            ids, kw["pixel_values"] = llama4_image_inputs(cfg, batch, seq, images, dtype, image_size, device)
            tr.add(kw["pixel_values"], "pixel_values")
        elif images and cfg.model_type == "mistral3":  # PixtralProcessor's inputs
            ids, kw["image_sizes"], kw["pixel_values"], sizes = mistral3_image_inputs(
                cfg, batch, seq, images, dtype, image_size, device)
            tr.add(sizes, "image_sizes")
            tr.add(kw["pixel_values"], "pixel_values")
        elif images and cfg.model_type == "mllama":  # MllamaProcessor's inputs (mllama_image_inputs)
            ids, kw["pixel_values"], kw["aspect_ratio_ids"], kw["aspect_ratio_mask"], kw["cross_attention_mask"] = \
                mllama_image_inputs(cfg, batch, seq, images, dtype, device)
            for k in ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask", "cross_attention_mask"):
                tr.add(kw[k], k)
        elif images:  # image+text: the processor's inputs (image_inputs), stepped inside _ImageMerge
            ids, kw["token_type_ids"], kw["pixel_values"] = image_inputs(cfg, batch, seq, images, dtype, device)
            tr.add(kw["token_type_ids"], "token_type_ids")
            tr.add(kw["pixel_values"], "pixel_values")
        else:
            ids = torch.randint(0, cfg.get_text_config().vocab_size, shape, device=device)
        labels = ids.clone()
        if packing:  # the collator's position ids (values do not matter under fake tensors)
            kw["position_ids"] = torch.arange(shape[1], device=device).expand(shape[0], -1).contiguous()
            tr.add(kw["position_ids"], "position_ids")
        opt = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
        for step in (1, 2) if device == "cpu" else (2,):
            last = step == 2
            if last:
                start_measured_step(tr, opt)
            tr.phase = "forward"
            ac = autocast_for(precision, device)
            if ac:
                ac.__enter__()
            if last and ckpt == "none":
                saved.__enter__()
            try:  # (a forward that raises must not leave autocast or the saved-tensor hooks on)
                with _ImageMerge() if images else contextlib.nullcontext(), vision():
                    loss = model(input_ids=ids, labels=labels, use_cache=False, **kw).loss
            finally:
                if last and ckpt == "none":
                    saved.__exit__(None, None, None)
                if ac:
                    ac.__exit__(None, None, None)
            if last:
                res["saved"] = saved.bytes_alive() if ckpt == "none" else None
            if device == "cuda":  # fake CUDA tensors: the autograd engine asks for a real device
                return {**res, "peak": None, "peak_at": None}  # (hasPrimaryContext): the forward only
            tr.phase = "backward"
            with _ImageMerge() if images else contextlib.nullcontext(), vision():
                loss.backward()
            del loss
            gc.collect()
            tr.phase = "optimizer.step"
            opt.step()
            opt.zero_grad(set_to_none=True)
            gc.collect()
    res["peak"], res["peak_at"] = tr.peak, tr.peak_at
    if live_at_peak:
        res["live_at_peak"] = tr.peak_live
    return res


def memplan_lora(cfg_path, batch, seq, precision, ckpt, r, targets, full=False, dropout=0.0, memplan="./memplan",
                 packing="", attention=None, images=0, train_blocks=None, image_size=None):
    cmd = [memplan, "estimate", cfg_path, "--batch", str(batch), "--seq", str(seq), "--precision", precision,
           "--checkpoint", ckpt, "--workspace", "0", "--use-cache", "off", "--json"]  # torch: use_cache=False
    if images:
        cmd += ["--images", str(images)]
    if images and image_size:  # (height, width) pixels
        cmd += ["--image-size", "%dx%d" % tuple(image_size)]
    if train_blocks:  # --finetune freeze (its vision tower stays frozen)
        cmd += ["--finetune", "freeze", "--train-blocks", train_blocks]
    if attention:
        cmd += ["--attention", attention]
    if packing:
        cmd += ["--packing" if packing == "rows" else "--padding-free"]
    if not full:
        cmd += ["--finetune", "lora", "--lora-r", str(r)]
        if targets:
            cmd += ["--lora-targets", targets]
        if dropout:
            cmd += ["--lora-dropout", repr(dropout)]
    r_ = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return {"trainable": r_["model"]["trainable_params"], "peak": r_["memory"]["peak_allocated_bytes"],
            "saved": sum(l["activation_bytes"] for l in r_["layers"]), "peak_at": r_["memory"]["peak_event"],
            "args": cmd[3:]}


def bench_config(path, tmpdir):
    """The config both sides read: dropout off (torch_step.load_config), written to tmpdir."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_step
    d = torch_step.load_config(path)
    out = os.path.join(tmpdir, os.path.basename(path))
    with open(out, "w") as f:
        json.dump(d, f)
    return out, d


def lora_bench(quick, out, only=(), skip=0):
    """The LoRA step rows (printed, `out`, and as data in rows/peft_step.jsonl for
    tests/replay_accuracy.py)."""
    import tempfile
    import time
    import peft
    import torch
    import transformers
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rowlib
    from torch_step import cuda_only_bytes
    tmpdir = tempfile.mkdtemp(prefix="peft_step_")
    configs = ["models/hf/qwen2-0.5b.json", "models/hf/gpt2.json"]
    if not quick:
        configs += ["models/hf/llama-2-7b.json", "models/hf/pythia-160m.json"]
    if only:
        configs = [c for c in configs if any(o in c for o in only)]
    settings = []
    for cfg in (o for o in only if o.endswith(".json")):  # a config file by path (multimodal, text-only):
        for prec in ("fp32", "amp-bf16", "bf16"):         # peft has no default target for these classes
            for ckpt in ("none", "layers"):
                settings.append((cfg, prec, ckpt, 0, None, True))
                settings.append((cfg, prec, ckpt, 16, "all-linear", False))
                settings.append((cfg, prec, ckpt, 16, "q_proj,v_proj", False))
    for cfg in configs:
        for prec in ("fp32", "amp-bf16", "bf16"):
            for ckpt in ("none", "layers"):
                settings.append((cfg, prec, ckpt, 0, None, True))
                settings.append((cfg, prec, ckpt, 16, None, False))
                settings.append((cfg, prec, ckpt, 64, "all-linear", False))
    lines = ["| config | precision | ckpt | finetune | trainable torch / memplan | saved torch | saved memplan "
             "| diff | CUDA-only | diff vs CUDA | peak torch | peak memplan | diff | diff vs CUDA |", "|" + "---|" * 14]
    batch, seq = 2, 256
    for path, prec, ckpt, r, tg, full in settings[skip:]:  # --skip K: resume after K rows
        cfg, d = bench_config(path, tmpdir)
        try:  # a setting peft cannot run (PhiMoE's all-linear wraps its tuple-returning router): say so
            t = torch_lora_step(cfg, batch, seq, prec, ckpt, r, tg, full)
        except Exception as e:
            row = "| %s | %s | %s | %s | torch failed: %s |" % (os.path.basename(cfg), prec, ckpt, tg or "full",
                                                             str(e).splitlines()[0][:80])
            print(row, flush=True)
            lines.append(row)
            continue
        m = memplan_lora(cfg, batch, seq, prec, ckpt, r, tg, full)
        # what CUDA autocast keeps beyond CPU autocast (torch_step.cuda_only_bytes: GPT-2's gelu_new
        # pow in fp32); a LoRA base keeps the same (the ops run on inputs that require grad)
        cuda, why = cuda_only_bytes(d, batch, seq, prec, "sdpa", ckpt)
        cuda_pk = cuda if t["peak_at"].startswith(("backward", "forward")) else 0
        ft = "full" if full else "lora r%d %s" % (r, tg or "default")
        sv_t = "%.2f MiB" % (t["saved"] / 2**20) if t["saved"] is not None else "-"
        sv_d = "%+.2f%%" % (100.0 * (m["saved"] - t["saved"]) / t["saved"]) if t["saved"] else "-"
        sv_c = "%+.2f%%" % (100.0 * (m["saved"] - t["saved"] - cuda) / (t["saved"] + cuda)) if t["saved"] else "-"
        row = ("| %s | %s | %s | %s | %d / %d%s | %s | %.2f MiB | %s | %s | %s | %.2f MiB | %.2f MiB | %+.2f%% "
               "| %+.2f%% |") % (
            os.path.basename(cfg), prec, ckpt, ft, t["trainable"], m["trainable"],
            "" if t["trainable"] == m["trainable"] else " MISMATCH", sv_t, m["saved"] / 2**20, sv_d,
            "%.2f MiB (%s)" % (cuda / 2**20, why) if cuda else "", sv_c,
            t["peak"] / 2**20, m["peak"] / 2**20, 100.0 * (m["peak"] - t["peak"]) / t["peak"],
            100.0 * (m["peak"] - t["peak"] - cuda_pk) / (t["peak"] + cuda_pk))
        print(row, flush=True)
        lines.append(row)
        figures = {"trainable_params": rowlib.figure(t["trainable"], m["trainable"]),
                   "peak": rowlib.figure(t["peak"], m["peak"], cuda_pk)}
        if t["saved"] is not None:
            figures["saved"] = rowlib.figure(t["saved"], m["saved"], cuda)
        rowlib.save_rows("peft_step", [{  # the evidence, kept as data (rowlib.py)
            "source": "bench/accuracy/peft_step.py lora run of %s" % time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "config": path, "max_layers": 0, "args": m["args"], "figures": figures,
            "recorded": {"trainable_params": m["trainable"], "peak": m["peak"], "saved": m["saved"]},
            "versions": rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                            peft=peft.__version__),
        }])
    if out:
        with open(out, "w") as f:
            f.write("# bench/accuracy/peft_step.py lora: batch %d x seq %d, CPU FakeTensorMode, torch %s\n\n" % (
                batch, seq, __import__("torch").__version__))
            f.write("\n".join(lines) + "\n")


BF16_AMP_CONFIGS = ("models/hf/gpt2.json", "models/hf/qwen2-0.5b.json", "models/hf/llama-3.2-1b.json")


def bf16_amp_bench(out=None, only=(), memplan="./memplan", max_layers=4):
    """--precision bf16-amp (bf16 weights under bf16 autocast; peft's adapters fp32): the model is
    built in bf16, wrapped with peft (LoRA r16, its default targets and all-linear; and full
    fine-tuning), and stepped under autocast(bfloat16) twice on fake CPU tensors (CPU autocast's
    lists).  CUDA's lists differ on ops these models run on bf16 inputs (autocast_mode.cpp, torch
    2.15: layer_norm and pow are on CUDA's fp32 list, not the CPU's; GPT-2's LayerNorm and
    gelu_new): the same forward is run again on fake *CUDA* tensors with CUDA autocast switched
    on (CudaAutocast; SDPA as flash, flash_sdpa_on_fake_cuda), and what autograd saves there
    beyond the CPU run is the row's CUDA-only bytes (measured, not derived; the fake CUDA
    backward cannot run: the autograd engine asks for a device).  That difference is what is
    live beyond the CPU at a backward peak; with checkpointing the forward saves only block
    inputs on both, and the extra is not measured (the row says "-")."""
    import tempfile
    import time
    import peft
    import torch
    import transformers
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rowlib
    tmpdir = tempfile.mkdtemp(prefix="peft_bf16amp_")
    batch, seq = 2, 256
    lines = ["| config | ckpt | finetune | trainable torch / memplan | saved CPU | saved CUDA | saved memplan "
             "| diff vs CUDA | peak CPU | peak memplan | CUDA-only | diff vs CUDA |", "|" + "---|" * 12]
    for path in (c for c in BF16_AMP_CONFIGS if not only or any(o in c for o in only)):
        d = rowlib.load_config(path, max_layers)
        cfg = os.path.join(tmpdir, os.path.basename(path))
        with open(cfg, "w") as f:
            json.dump(d, f)
        cuda_saved = {}
        for ckpt in ("none", "layers"):
            for r, tg, full in ((0, None, True), (16, None, False), (16, "all-linear", False)):
                t = torch_lora_step(cfg, batch, seq, "bf16-amp", ckpt, r, tg, full)
                if ckpt == "none":
                    c = torch_lora_step(cfg, batch, seq, "bf16-amp", ckpt, r, tg, full, device="cuda")
                    cuda_saved[(r, tg)] = c["saved"] - t["saved"]
                extra = cuda_saved.get((r, tg), 0) if ckpt == "none" else 0
                m = memplan_lora(cfg, batch, seq, "bf16-amp", ckpt, r, tg, full, memplan=memplan)
                pk_extra = extra if t["peak_at"].startswith(("backward", "forward")) else 0
                ft = "full" if full else "lora r%d %s" % (r, tg or "default")
                row = "| %s | %s | %s | %d / %d | %s | %s | %s | %s | %.2f MiB | %.2f MiB | %s | %+.3f%% |" % (
                    os.path.basename(path), ckpt, ft, t["trainable"], m["trainable"],
                    "%.2f MiB" % (t["saved"] / MIB) if t["saved"] is not None else "-",
                    "%.2f MiB" % ((t["saved"] + extra) / MIB) if t["saved"] is not None else "-",
                    "%.2f MiB" % (m["saved"] / MIB),
                    "%+.3f%%" % (100.0 * (m["saved"] - t["saved"] - extra) / (t["saved"] + extra))
                    if t["saved"] else "-", t["peak"] / MIB, m["peak"] / MIB,
                    "%.2f MiB" % (pk_extra / MIB) if ckpt == "none" else "-",
                    100.0 * (m["peak"] - t["peak"] - pk_extra) / (t["peak"] + pk_extra))
                print(row, flush=True)
                lines.append(row)
                figures = {"trainable_params": rowlib.figure(t["trainable"], m["trainable"]),
                           "peak": rowlib.figure(t["peak"], m["peak"], pk_extra)}
                if t["saved"] is not None:
                    figures["saved"] = rowlib.figure(t["saved"], m["saved"], extra)
                rowlib.save_rows("peft_step", [{
                    "source": "bench/accuracy/peft_step.py bf16-amp run of %s (CPU fake tensors; extra: the "
                              "fake-CUDA forward's saved bytes beyond the CPU's)" % time.strftime(
                                  "%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "config": path, "max_layers": max_layers, "args": m["args"], "figures": figures,
                    "recorded": {"trainable_params": m["trainable"], "peak": m["peak"], "saved": m["saved"]},
                    "versions": rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                                    peft=peft.__version__),
                }])
    if out:
        with open(out, "w") as f:
            f.write("# bench/accuracy/peft_step.py bf16-amp: batch %d x seq %d, %d layers, fake tensors, torch %s\n\n"
                    % (batch, seq, max_layers, torch.__version__))
            f.write("\n".join(lines) + "\n")


MIB = 1 << 20


def seq2seq_lora_bench(out=None, memplan="./memplan"):
    """T5 / flan-t5 with peft's default LoRA (q, v; task SEQ_2_SEQ_LM), labels of the target
    length, CUDA's memory-efficient SDPA for the position-bias mask (torch_step.CUDA_FLOAT_MASK),
    every layer at real widths: step 2's peak, torch vs memplan (--target-seq)."""
    import gc
    import tempfile
    import torch
    import transformers
    import peft
    from torch._subclasses.fake_tensor import FakeTensorMode
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import time
    import rowlib
    import torch_step
    torch_step.CUDA_FLOAT_MASK = True
    tmpdir = tempfile.mkdtemp(prefix="peft_s2s_")
    batch, seq, tgt = 4, 512, 128
    lines = ["| config | precision | ckpt | trainable torch / memplan | peak torch MiB | peak memplan MiB | diff "
             "| CUDA-only MiB | diff vs CUDA |", "|" + "---|" * 9]
    for path in ("models/hf/t5-small.json", "models/hf/flan-t5-base.json"):
        cfg_path, d = bench_config(path, tmpdir)
        for prec in ("fp32", "amp-bf16", "bf16"):
            for ckpt in ("none", "layers"):
                cfg = transformers.AutoConfig.for_model(**d)
                cfg._attn_implementation = "sdpa"
                dtype = torch.bfloat16 if prec == "bf16" else torch.float32
                fake = FakeTensorMode(allow_non_fake_inputs=True)
                with torch.device("meta"):
                    model = transformers.AutoModelForSeq2SeqLM.from_config(cfg, dtype=dtype)
                    model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                                       task_type="SEQ_2_SEQ_LM"))
                with fake:
                    model.to_empty(device="cpu")
                    model.get_base_model().tie_weights()  # to_empty unties them
                model.train()
                trainable = [p for p in model.parameters() if p.requires_grad]
                tr = torch_step.LiveTracker()
                with fake, tr:
                    if ckpt == "layers":
                        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                    for p in model.parameters():
                        tr.add(p, "param")
                    for b in model.buffers():
                        tr.add(b, "buffer")
                    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
                    labels = torch.randint(0, cfg.vocab_size, (batch, tgt))
                    opt = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
                    for step in (1, 2):
                        if step == 2:
                            start_measured_step(tr, opt)
                        tr.phase = "forward"
                        ac = torch.autocast("cpu", dtype=torch.bfloat16) if prec == "amp-bf16" else torch_step._Null()
                        with ac:
                            loss = model(input_ids=ids, labels=labels, use_cache=False).loss
                        tr.phase = "backward"
                        loss.backward()
                        del loss
                        gc.collect()
                        tr.phase = "optimizer.step"
                        opt.step()
                        opt.zero_grad(set_to_none=True)
                        gc.collect()
                cmd = [memplan, "estimate", cfg_path, "--batch", str(batch), "--seq", str(seq), "--target-seq",
                       str(tgt), "--precision", prec, "--checkpoint", ckpt, "--workspace", "0", "--use-cache", "off",
                       "--json", "--finetune", "lora", "--lora-r", "16"]
                m = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
                mp = m["memory"]["peak_allocated_bytes"]
                cuda, why = torch_step.cuda_only_bytes(d, batch, seq, prec, "sdpa", ckpt, tgt)
                cuda_pk = cuda if tr.peak_at.startswith(("backward", "forward")) else 0
                row = "| %s | %s | %s | %d / %d | %.1f | %.1f | %+.2f%% | %s | %+.2f%% |" % (
                    os.path.basename(path), prec, ckpt, sum(p.numel() for p in trainable),
                    m["model"]["trainable_params"], tr.peak / 2**20, mp / 2**20, 100.0 * (mp - tr.peak) / tr.peak,
                    "%.1f (%s)" % (cuda / 2**20, why) if cuda else "", 100.0 * (mp - tr.peak - cuda_pk) / (tr.peak + cuda_pk))
                print(row, flush=True)
                lines.append(row)
                rowlib.save_rows("peft_step", [{  # the evidence, kept as data (rowlib.py)
                    "source": "bench/accuracy/peft_step.py seq2seq-lora run of %s" % time.strftime(
                        "%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "config": path, "max_layers": 0, "args": cmd[3:],
                    "figures": {"trainable_params": rowlib.figure(sum(p.numel() for p in trainable),
                                                                  m["model"]["trainable_params"]),
                                "peak": rowlib.figure(tr.peak, mp, cuda_pk)},
                    "recorded": {"trainable_params": m["model"]["trainable_params"], "peak": mp},
                    "versions": rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                                    peft=peft.__version__),
                }])
    if out:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")


def bnb_version():
    import bitsandbytes
    return bitsandbytes.__version__


def trl_version(on):
    if not on:
        return {}
    import trl
    return {"trl": trl.__version__}


def qlora_step(precision, ckpt, batch=2, seq=128, trl=False, targets=None):
    """trl: the step as TRL 1.16's SFTTrainer runs it: its cast of a quantized model's trainable
    parameters to bf16 after get_peft_model (sft_trainer.py:905-911; dpo, kto, grpo alike) and its
    chunked LM head (loss_heads.trl_cuda_branches, as loss_heads.py runs it), planned by memplan
    with --loss chunked-nll.  targets: LoraConfig target_modules (None: peft's default)."""
    import gc
    import tempfile
    import torch
    import transformers
    import peft
    Live, _ = _trackers()
    d = tempfile.mkdtemp(prefix="peft_step_")
    cfg = transformers.LlamaConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=704, vocab_size=1024, max_position_embeddings=256,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    cdt = torch.bfloat16 if precision == "amp-bf16" else torch.float32
    bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=cdt)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, quantization_config=bnb, dtype=torch.float32,
                                                              device_map="cpu", attn_implementation="sdpa")
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=ckpt == "layers",
                                                 gradient_checkpointing_kwargs={"use_reentrant": False})
    model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                                       target_modules=targets))
    if trl:
        # trl 1.16.0 sft_trainer.py:908-911: `if _is_quantized_model:` every trainable parameter
        # but a DoRA magnitude vector gets param.data = param.data.to(torch.bfloat16)
        assert getattr(model, "is_loaded_in_4bit", False)
        for name, p in model.named_parameters():
            if p.requires_grad and "lora_magnitude_vector" not in name:
                p.data = p.data.to(torch.bfloat16)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from loss_heads import trl_cuda_branches
        # SFTTrainer (trl 1.16.0 sft_trainer.py:1142-1147): on the base model, with these outputs
        trl_cuda_branches()(model.get_base_model(), outputs=("log_probs", "entropy", "is_top1"))
    model.train()
    tr = Live()
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in model.parameters():
        tr.add(p, "param")
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            for t in [qs.absmax, qs.code] + ([qs.offset, qs.state2.absmax, qs.state2.code] if qs.nested else []):
                tr.add(t, "quant_state")
    for b in model.buffers():
        tr.add(b, "buffer")
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    losses = []
    with tr:
        opt = torch.optim.AdamW(trainable, lr=1e-3, foreach=True)
        for step in (1, 2, 3):
            if step == 2:
                start_measured_step(tr, opt)
            tr.phase = "forward"
            ac = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "amp-bf16" else None
            if ac:
                ac.__enter__()
            loss = model(input_ids=ids, labels=ids, use_cache=False, **({"fused_lm_head": True} if trl else {})).loss
            if ac:
                ac.__exit__(None, None, None)
            tr.phase = "backward"
            loss.backward()
            losses.append(loss.item())
            del loss
            gc.collect()
            tr.phase = "optimizer.step"
            opt.step()
            opt.zero_grad(set_to_none=True)
            gc.collect()
            if step == 2:
                peak, peak_at = tr.peak, tr.peak_at
    cmd = ["./memplan", "estimate", os.path.join(d, "config.json"), "--finetune", "qlora", "--precision", precision,
           "--batch", str(batch), "--seq", str(seq), "--checkpoint", ckpt, "--workspace", "0", "--use-cache", "off",
           "--json"] + (["--loss", "chunked-nll"] if trl else []) + (["--lora-targets", targets] if targets else [])
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import time
    import rowlib
    with open(os.path.join(d, "config.json")) as f:
        cfg_json = json.load(f)
    rowlib.save_rows("peft_step", [{  # the evidence, kept as data (rowlib.py)
        "source": "bench/accuracy/peft_step.py qlora-step run of %s" % time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "config": "peft_step.py qlora_step's LlamaConfig" + (", TRL's cast and head" if trl else ""),
        "config_json": cfg_json, "args": cmd[3:],
        "figures": {"trainable_params": rowlib.figure(sum(p.numel() for p in trainable), r["model"]["trainable_params"]),
                    "peak": rowlib.figure(peak, r["memory"]["peak_allocated_bytes"])},
        "versions": rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                        peft=peft.__version__, bitsandbytes=bnb_version(), **trl_version(trl)),
    }])
    return {"trainable": sum(p.numel() for p in trainable), "peak": peak, "peak_at": peak_at, "losses": losses,
            "m_trainable": r["model"]["trainable_params"], "m_peak": r["memory"]["peak_allocated_bytes"],
            "m_peak_at": r["memory"]["peak_event"]}


# ---- steps whose peak is a checkpointed block's recompute ------------------------------------------

# Llama-shaped configs with a small vocabulary: the loss no longer holds the step's largest tensors,
# so a checkpointed step peaks in the last block's recompute and backward (issue 26 item 5).
RECOMPUTE_CONFIGS = {
    "llama-1024-v1000": dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=1000,
                             hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
                             num_key_value_heads=8, max_position_embeddings=4096, rms_norm_eps=1e-5,
                             hidden_act="silu", tie_word_embeddings=False, attention_dropout=0.0),
    # Llama-2-7B's widths (hidden 4096, MLP 11008, 32 heads), 4 layers, vocabulary 1000
    "llama-7b-shape-v1000": dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=1000,
                                 hidden_size=4096, intermediate_size=11008, num_hidden_layers=4,
                                 num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                                 rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False,
                                 attention_dropout=0.0),
}


def recompute_settings(name):
    """(batch, seq, precision, finetune, dropout) rows for one of RECOMPUTE_CONFIGS, all
    checkpointed (layers): LoRA all-linear r16 with dropout 0 and 0.05, and full fine-tuning at
    a batch whose activations outweigh the parameter gradients (else its peak is the last
    backward or the optimizer step)."""
    if name == "llama-1024-v1000":
        lora, full, precs = [(2, 1024), (1, 2048)], [(2, 1024), (8, 2048)], ("bf16", "amp-bf16", "fp32")
    else:
        lora, full, precs = [(4, 2048)], [(8, 4096)], ("bf16", "amp-bf16")
    rows = []
    for prec in precs:
        for b, s in lora:
            for drop in (0.0, 0.05):
                rows.append((b, s, prec, "lora", drop))
        for b, s in full:
            rows.append((b, s, prec, "full", 0.0))
    return rows


def recompute_bench(out=None, only=(), memplan="./memplan", show=0, save=True):
    """The checkpointed steps whose peak is the last block's recompute: torch (fake tensors, live
    storages, peft LoRA all-linear r16 or full) against memplan; rows to rows/peft_step.jsonl."""
    import tempfile
    import time
    import peft
    import torch
    import transformers
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rowlib
    tmpdir = tempfile.mkdtemp(prefix="peft_recompute_")
    lines = ["| config | b x s | precision | finetune | torch peak MiB | memplan MiB | diff | torch peak at "
             "| memplan peak at |", "|" + "---|" * 9]
    for name, d in RECOMPUTE_CONFIGS.items():
        if only and not any(o in name for o in only):
            continue
        cfg = os.path.join(tmpdir, name + ".json")
        with open(cfg, "w") as f:
            json.dump(d, f)
        for b, s, prec, ft, drop in recompute_settings(name):
            full = ft == "full"
            t = torch_lora_step(cfg, b, s, prec, "layers", 16, "all-linear", full, drop, live_at_peak=bool(show))
            m = memplan_lora(cfg, b, s, prec, "layers", 16, "all-linear", full, drop, memplan)
            what = "full" if full else "lora r16 all-linear%s" % (" dropout %g" % drop if drop else "")
            row = "| %s | %dx%d | %s | %s | %.2f | %.2f | %+.3f%% | %s | %s |" % (
                name, b, s, prec, what, t["peak"] / 2**20, m["peak"] / 2**20,
                100.0 * (m["peak"] - t["peak"]) / t["peak"], t["peak_at"], m["peak_at"])
            print(row, flush=True)
            if show:
                for n, lab in t["live_at_peak"][:show]:
                    print("#   %10d %s" % (n, lab))
            lines.append(row)
            if not save:
                continue
            rowlib.save_rows("peft_step", [{  # the evidence, kept as data (rowlib.py)
                "source": "bench/accuracy/peft_step.py recompute run of %s" % time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                          time.gmtime()),
                "config": "peft_step.py RECOMPUTE_CONFIGS[%r]" % name, "config_json": d, "args": m["args"],
                "figures": {"trainable_params": rowlib.figure(t["trainable"], m["trainable"]),
                            "peak": rowlib.figure(t["peak"], m["peak"])},
                "recorded": {"trainable_params": m["trainable"], "peak": m["peak"], "torch_peak_at": t["peak_at"]},
                "versions": rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                                peft=peft.__version__),
            }])
    if out:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")


# ---- trainable parameters as peft counts them ----------------------------------------------------

PEFT_TASK = (("ForCausalLM", "CAUSAL_LM"), ("LMHeadModel", "CAUSAL_LM"), ("ForSequenceClassification", "SEQ_CLS"),
             ("ForTokenClassification", "TOKEN_CLS"), ("ForQuestionAnswering", "QUESTION_ANS"),
             ("ForImageClassification", "SEQ_CLS"))  # SEQ_CLS keeps ViT's classifier too (modules_to_save)


def peft_params(path, r, targets):
    """(trainable, total) from peft, or None where peft refuses the config (the reason beside)."""
    import torch
    import transformers
    import peft
    with open(path) as f:
        d = json.load(f)
    arch = d["architectures"][0]
    cfg = transformers.AutoConfig.for_model(**d)
    with torch.device("meta"):
        model = getattr(transformers, arch)(cfg)
    task = next((t for suffix, t in PEFT_TASK if arch.endswith(suffix)), None)
    kw = dict(r=r, lora_alpha=2 * r, lora_dropout=0.0, task_type=task)
    if targets:
        kw["target_modules"] = targets if targets == "all-linear" else targets.split(",")
    try:
        return peft.get_peft_model(model, peft.LoraConfig(**kw)).get_nb_trainable_parameters(), ""
    except (ValueError, TypeError) as e:  # no default targets; an adapted module in modules_to_save
        return None, str(e).split(".")[0]


def memplan_params(path, r, targets):
    cmd = ["./memplan", "estimate", path, "--seq", "16", "--finetune", "lora", "--lora-r", str(r), "--json"]
    if targets:
        cmd += ["--lora-targets", targets]
    j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return j["model"]["trainable_params"], j["model"]["params"]


def params_bench(paths):
    import glob
    paths = paths or sorted(glob.glob("models/hf/*.json"))
    rows, r = [], 16
    print("| config | targets | peft trainable / total | memplan trainable / total | |")
    print("|---|---|---|---|---|")
    for p in paths:
        for tg in (None, "all-linear"):
            pe, why = peft_params(p, r, tg)
            note = ""
            if pe is None and tg is None:  # peft needs target_modules: memplan assumes all-linear
                pe, _ = peft_params(p, r, "all-linear")
                note = "peft: %s; memplan assumes all-linear" % why
            mp = memplan_params(p, r, tg)
            ok = "exact" if pe == mp else "MISMATCH"
            print("| %s | %s | %d / %d | %d / %d | %s %s |" % (os.path.basename(p), tg or "default", pe[0], pe[1],
                                                             mp[0], mp[1], ok, note), flush=True)
            rows.append('        {"%s", %d, %s, %d, %d},' % (p, r, '"%s"' % tg if tg else "NULL", pe[0], pe[1]))
    print("\n/* tests/test_finetune.c rows (peft %s) */" % __import__("peft").__version__)
    print("\n".join(rows))


def memplan_weights(path, *extra):
    out = subprocess.run(["./memplan", "estimate", path, "--seq", "16", "--json", *extra],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["memory"]["weights_bytes"]


def lora_packing_bench(out, only=()):
    """Packed batches (memplan --packing / --padding-free) at the realistic LoRA setting: bf16 base,
    LoRA all-linear r16, transformers' checkpointing, Llama-3.2-1B and Llama-3-8B at 4 layers
    (torch_step.load_config(.., 4): every layer is lowered alike), seq 4096 and 8192, SDPA (the
    block-diagonal mask) and eager.  Rows go to rows/peft_step.jsonl."""
    import tempfile
    import time
    import peft
    import torch
    import transformers
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rowlib
    import torch_step
    tmpdir = tempfile.mkdtemp(prefix="peft_pack_")
    settings = []
    for path in ("models/hf/llama-3.2-1b.json", "models/hf/llama-3-8b.json"):
        for (b, s_) in ((1, 8192), (2, 4096)):
            for attn in ("sdpa", "eager"):
                for pk in ("rows", "padding-free"):
                    if b == 1 and pk == "padding-free":
                        continue  # one row either way
                    settings.append((path, b, s_, attn, pk))
    if only:
        settings = [x for x in settings if any(o in x[0] for o in only)]
    lines = ["| config | b x s | attn | packing | peak torch MiB | peak memplan MiB | diff | torch peak at |",
             "|---|---|---|---|---:|---:|---:|---|"]
    for path, b, s_, attn, pk in settings:
        d = torch_step.load_config(path, 4)
        cfg = os.path.join(tmpdir, os.path.basename(path))
        with open(cfg, "w") as f:
            json.dump(d, f)
        t = torch_lora_step(cfg, b, s_, "bf16", "layers", 16, "all-linear", packing=pk, attention=attn)
        m = memplan_lora(cfg, b, s_, "bf16", "layers", 16, "all-linear", packing=pk, attention=attn)
        row = "| %s (4 layers) | %dx%d | %s | %s | %.1f | %.1f | %+.2f%% | %s |" % (
            os.path.basename(path), b, s_, attn, pk, t["peak"] / 2**20, m["peak"] / 2**20,
            100.0 * (m["peak"] - t["peak"]) / t["peak"], t["peak_at"])
        print(row, flush=True)
        lines.append(row)
        rowlib.save_rows("peft_step", [{
            "source": "bench/accuracy/peft_step.py lora-packing run of %s" % time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                         time.gmtime()),
            "config": path, "max_layers": 4, "args": m["args"],
            "figures": {"trainable_params": rowlib.figure(t["trainable"], m["trainable"]),
                        "peak": rowlib.figure(t["peak"], m["peak"])},
            "recorded": {"trainable_params": m["trainable"], "peak": m["peak"], "torch_peak_at": t["peak_at"]},
            "versions": rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                            peft=peft.__version__),
        }])
    if out:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")


IMAGE_SETTINGS = (  # (config, batch, seq, rows of (precision, ckpt, r, targets, full)); targets "frozen-tower":
    # full fine-tuning of the language model, the vision tower and projector requires_grad False
    ("bench/accuracy/multimodal/gemma3-shrunk.json", 2, 256,
     (("amp-bf16", "none", 0, None, True), ("amp-bf16", "layers", 0, None, True), ("bf16", "layers", 0, None, True),
      ("bf16", "none", 0, "frozen-tower", True), ("amp-bf16", "layers", 0, "frozen-tower", True),
      ("bf16", "none", 16, "all-linear", False), ("bf16", "layers", 16, "all-linear", False),
      ("bf16", "layers", 16, "q_proj,v_proj", False))),
    ("bench/accuracy/multimodal/gemma3-4b-shaped.json", 1, 1024,
     (("amp-bf16", "layers", 0, None, True), ("bf16", "layers", 0, None, True),
      ("bf16", "layers", 16, "all-linear", False), ("bf16", "layers", 16, "q_proj,v_proj", False),
      ("bf16", "layers", 0, "frozen-tower", True))),
    ("models/hf/gemma-3-4b-it.json", 1, 1024,  # the whole model: 34 text and 27 vision layers
     (("bf16", "layers", 16, "all-linear", False), ("bf16", "layers", 0, None, True))),
    # Mistral 3 (Pixtral): the shrunk config (224 x 224: 256 patches, 72 tokens an image), at 112 x
    # 224 (--image-size: 128 patches, 36 tokens) and with 448 x 448 images; Mistral-Small-3.1-24B's
    # widths (2 text, 4 vision layers) with one 1540 x 1540 image (12,100 patches, 3,080 tokens) and
    # one 784 x 1540
    ("bench/accuracy/multimodal/mistral3-shrunk.json", 2, 256,  # (a 6th element: the image counts)
     (("amp-bf16", "none", 0, None, True, (0, 1)), ("amp-bf16", "layers", 0, None, True, (1,)),
      ("bf16", "none", 0, None, True, (1, 2)), ("fp32", "none", 0, None, True, (1,)),
      ("bf16", "none", 0, "frozen-tower", True, (1,)), ("bf16", "layers", 16, "all-linear", False, (1, 2)),
      ("bf16", "none", 16, "q_proj,v_proj", False, (1,)))),
    ("bench/accuracy/multimodal/mistral3-shrunk.json@112x224", 2, 256,
     (("bf16", "none", 0, None, True, (2,)),)),
    ("bench/accuracy/multimodal/mistral3-shrunk-448.json", 2, 640,  # 448 x 448: 1,024 patches, 272 tokens
     (("amp-bf16", "none", 0, None, True, (1,)), ("bf16", "layers", 16, "all-linear", False, (1,)),
      ("amp-bf16", "none", 0, None, True, (1,), "eager"))),  # (a 7th: --attention)
    ("bench/accuracy/multimodal/mistral3-24b-shaped.json", 1, 4096,
     (("bf16", "none", 0, None, True, (1,)), ("bf16", "layers", 16, "all-linear", False, (1,)))),
    # the tower's peaks: Mistral Small's Pixtral at its widths (4 layers), a 1540 x 1540 image, before
    # the shrunk text model
    ("bench/accuracy/multimodal/mistral3-pixtral-real.json", 1, 3200,
     (("amp-bf16", "none", 0, None, True, (1,)), ("bf16", "layers", 0, None, True, (1,)),
      ("bf16", "layers", 16, "all-linear", False, (1,)), ("amp-bf16", "layers", 16, "all-linear", False, (1,)),
      ("bf16", "none", 0, None, True, (1,), "eager"))),
    ("bench/accuracy/multimodal/mistral3-24b-shaped.json@784x1540", 1, 2048,
     (("amp-bf16", "layers", 16, "all-linear", False, (1,)),)),
    # Llama 4: the shrunk config (112 x 112 tiles, 16 tokens a tile; one tile by default, 224 x 336:
    # a 2 x 3 canvas and the global tile, 7 tiles), Scout's vision model at its widths (34 layers) with
    # a 1344 x 1344 image (4 x 4 tiles + 1: 17 x 577 positions through the tower) before the shrunk
    # text model, and Scout's widths (2 text layers, the whole vision model) with a 672 x 672 image
    ("bench/accuracy/multimodal/llama4-shrunk-images.json", 2, 256,
     (("bf16", "none", 0, None, True, (1, 2)), ("amp-bf16", "none", 0, None, True, (1,)),
      ("bf16", "layers", 0, None, True, (1,)), ("amp-bf16", "layers", 0, None, True, (1,)),
      ("fp32", "none", 0, None, True, (1,)), ("bf16", "none", 0, "frozen-tower", True, (1,)),
      ("amp-bf16", "layers", 0, "frozen-tower", True, (1,)),
      ("bf16", "none", 16, "q_proj,v_proj", False, (1,)), ("bf16", "layers", 16, "q_proj,v_proj", False, (1,)),
      ("amp-bf16", "layers", 16, "q_proj,v_proj", False, (1,)),
      ("bf16", "layers", 16, "q_proj,v_proj,fc1,fc2,linear,linear_1", False, (1,)),
      ("bf16", "none", 0, None, True, (1,), "eager"), ("fp32", "none", 0, None, True, (1,), "eager"))),
    ("bench/accuracy/multimodal/llama4-shrunk-images.json@224x336", 2, 256,
     (("bf16", "none", 0, None, True, (1, 2)), ("amp-bf16", "layers", 0, None, True, (1,)),
      ("bf16", "layers", 16, "q_proj,v_proj", False, (1,)))),
    ("bench/accuracy/multimodal/llama4-vision-real.json@1344x1344", 1, 2560,
     (("bf16", "none", 0, None, True, (1,)), ("amp-bf16", "layers", 0, None, True, (1,)),
      ("bf16", "layers", 16, "q_proj,v_proj", False, (1,)), ("amp-bf16", "none", 16, "q_proj,v_proj", False, (1,)),
      ("bf16", "none", 0, None, True, (1,), "eager"))),
    ("bench/accuracy/multimodal/llama4-scout-shaped.json", 1, 1024,  # the text-only twin of the amp row below
     (("amp-bf16", "layers", 16, "q_proj,v_proj", False, (0,)),)),
    ("bench/accuracy/multimodal/llama4-scout-shaped.json@672x672", 1, 1024,
     (("bf16", "layers", 16, "q_proj,v_proj", False, (1,)), ("bf16", "none", 16, "q_proj,v_proj", False, (1,)),
      ("amp-bf16", "layers", 16, "q_proj,v_proj", False, (1,)))),
)


def _save_image_row(bench, path, m, figures):
    """One measured image row into rows/peft_step.jsonl (the images and qwenvl benches)."""
    import time
    import peft
    import rowlib
    import torch
    import transformers
    rowlib.save_rows("peft_step", [{
        "source": "bench/accuracy/peft_step.py %s run of %s" % (bench, time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                    time.gmtime())),
        "config": path, "max_layers": 0, "args": m["args"], "figures": figures,
        "recorded": {"trainable_params": m["trainable"], "peak": m["peak"], "saved": m["saved"]},
        "versions": rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                        peft=peft.__version__),
    }])


def images_bench(out=None, memplan="./memplan", images=(0, 1, 2), only=()):
    """Gemma 3 and Mistral 3 steps with images (memplan --images N) beside the same rows text-only: the processor's
    batch (image_inputs) through Gemma3ForConditionalGeneration under FakeTensorMode (_ImageMerge),
    full fine-tuning and LoRA r16 (peft: all-linear also adapts SigLIP's Linears), checkpointing none
    and layers; the shrunk config (batch 2 x 256, one 16-token image = 256 patches) and a config of
    Gemma-3-4B's widths (6 text layers, 4 vision layers; batch 1 x 1024, 256 tokens per 896 x 896
    image = 4096 patches).  Rows go to rows/peft_step.jsonl; results: images_results.md."""
    import tempfile
    import peft
    import torch
    import transformers
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rowlib
    tmpdir = tempfile.mkdtemp(prefix="peft_images_")
    rows_path = os.path.join(rowlib.ROWS_DIR, "peft_step.jsonl")
    marked = {rowlib._key(r) for r in rowlib.read_rows(rows_path) if r.get("disagrees")}
    lines = ["| config | batch x seq | images | precision | ckpt | finetune | trainable torch / memplan "
             "| saved torch | saved memplan | diff | peak torch | peak memplan | diff | peak at (torch / memplan) |",
             "|" + "---|" * 14]
    for path, batch, seq, rows in IMAGE_SETTINGS:
        if only and not any(o in path for o in only):
            continue
        path, _, sz = path.partition("@")  # config@HxW: --image-size
        size = tuple(int(x) for x in sz.split("x")) if sz else None
        cfg, d = bench_config(path, tmpdir)
        for prec, ckpt, r, tg, full, *more in rows:
            attn = more[1] if len(more) > 1 else None
            for n in more[0] if more else images:
                if n * image_tokens(d, size) > seq or (n > 1 and ("4b" in path or "24b" in path)) or (not n and sz):
                    continue
                frozen = tg == "frozen-tower"
                if frozen and not n:
                    continue
                tb = "0-%d,embed,head" % (d["text_config"]["num_hidden_layers"] - 1) if frozen else None
                t = torch_lora_step(cfg, batch, seq, prec, ckpt, r, None if frozen else tg, full, images=n,
                                    freeze_vision=frozen, image_size=size, attention=attn or "sdpa")
                m = memplan_lora(cfg, batch, seq, prec, ckpt, r, None if frozen else tg, full, memplan=memplan,
                                 images=n, train_blocks=tb, image_size=size, attention=attn)
                ft = "full, frozen tower" if frozen else "full" if full else "lora r%d %s" % (r, tg)
                ft += ", %s attention" % attn if attn else ""
                sv_t = "%.2f MiB" % (t["saved"] / 2**20) if t["saved"] is not None else "-"
                sv_d = "%+.2f%%" % (100.0 * (m["saved"] - t["saved"]) / t["saved"]) if t["saved"] else "-"
                row = "| %s | %d x %d | %s | %s | %s | %s | %d / %d%s | %s | %.2f MiB | %s | %.2f MiB | %.2f MiB | " \
                      "%+.3f%% | %s / %s |" % (
                          os.path.basename(path), batch, seq, "%d (%s)" % (n, sz) if sz else str(n), prec, ckpt, ft,
                          t["trainable"], m["trainable"],
                          "" if t["trainable"] == m["trainable"] else " MISMATCH", sv_t, m["saved"] / 2**20, sv_d,
                          t["peak"] / 2**20, m["peak"] / 2**20, 100.0 * (m["peak"] - t["peak"]) / t["peak"],
                          t["peak_at"], m["peak_at"])
                print(row, flush=True)
                lines.append(row)
                figures = {"trainable_params": rowlib.figure(t["trainable"], m["trainable"]),
                           "peak": rowlib.figure(t["peak"], m["peak"])}
                if t["saved"] is not None:
                    figures["saved"] = rowlib.figure(t["saved"], m["saved"])
                row = {"config": path, "max_layers": 0, "args": m["args"]}
                if rowlib._key(row) in marked:  # a text-only twin marked `disagrees` by the lora run: kept
                    continue
                _save_image_row("images", path, m, figures)
    if out:
        rowlib.write_results(out, "# bench/accuracy/peft_step.py images: %s with images, CPU FakeTensorMode, "
                             "torch %s, transformers %s, peft %s\n\n%s\n" % (
                                 "Mistral 3" if only and all("mistral3" in o for o in only) else
                                 "Llama 4" if only and all("llama4" in o for o in only) else "Gemma 3",
                                 torch.__version__, transformers.__version__, peft.__version__, "\n".join(lines)))


QWENVL_SETTINGS = (  # (config, batch, seq, image sizes (height, width), rows (precision, ckpt, r, targets, full))
    ("bench/accuracy/multimodal/qwen2-vl-shrunk.json", 2, 256, ((224, 224), (448, 336)),
     (("bf16", "none", 0, None, True), ("amp-bf16", "layers", 0, None, True),
      ("bf16", "layers", 16, "all-linear", False), ("bf16", "none", 0, "frozen-tower", True))),
    ("bench/accuracy/multimodal/qwen2.5-vl-shrunk.json", 2, 256, ((224, 224), (448, 336)),
     (("bf16", "none", 0, None, True), ("amp-bf16", "layers", 0, None, True),
      ("bf16", "layers", 16, "all-linear", False), ("bf16", "none", 0, "frozen-tower", True))),
    ("bench/accuracy/multimodal/qwen2-vl-7b-shaped.json", 1, 1024, ((448, 448),),
     (("bf16", "layers", 0, None, True), ("bf16", "layers", 16, "all-linear", False))),
    ("bench/accuracy/multimodal/qwen2.5-vl-7b-shaped.json", 1, 1024, ((448, 448),),
     (("bf16", "layers", 0, None, True), ("bf16", "layers", 16, "all-linear", False))),
)


def qwenvl_bench(out=None, only=(), memplan="./memplan"):
    """Qwen2-VL and Qwen2.5-VL steps with images: the processor's batch (qwen_image_inputs: flattened
    patches, image_grid_thw, M-RoPE position ids) through *ForConditionalGeneration under
    FakeTensorMode (_ImageMerge, _QwenVision), beside the same step text-only (images 0: input_ids
    and labels).  Qwen2-VL's rows are also planned by memplan (--images 1 --image-size HxW) and
    saved to rows/peft_step.jsonl; Qwen2.5-VL's stay torch-side figures (memplan refuses --images for
    it: its tower is not modelled yet).  Results: qwenvl_images_results.md."""
    import tempfile
    import peft
    import torch
    import transformers
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rowlib
    tmpdir = tempfile.mkdtemp(prefix="peft_qwenvl_")
    lines = ["| config | batch x seq | image (px) | images | precision | ckpt | finetune | trainable torch / memplan "
             "| saved torch | saved memplan | peak torch | peak memplan | diff | peak at (torch / memplan) |",
             "|" + "---|" * 14]
    for path, batch, seq, sizes, rows in QWENVL_SETTINGS:
        if only and not any(o in path for o in only):
            continue
        cfg, d = bench_config(path, tmpdir)
        planned = d.get("model_type") in ("qwen2_vl", "qwen2_5_vl")
        for prec, ckpt, r, tg, full in rows:
            frozen = tg == "frozen-tower"
            for n, size in [(0, None)] * (not frozen) + [(1, z) for z in sizes]:
                t = torch_lora_step(cfg, batch, seq, prec, ckpt, r, None if frozen else tg, full, images=n,
                                    freeze_vision=frozen, image_size=size)
                tb = "0-%d,embed,head" % (d["num_hidden_layers"] - 1) if frozen else None
                m = memplan_lora(cfg, batch, seq, prec, ckpt, r, None if frozen else tg, full, memplan=memplan,
                                 images=n, train_blocks=tb, image_size=size) if planned else None
                ft = "full, frozen tower" if frozen else "full" if full else "lora r%d %s" % (r, tg)
                sv_t = "%.2f MiB" % (t["saved"] / 2**20) if t["saved"] is not None else "-"
                row = "| %s | %d x %d | %s | %d | %s | %s | %s | %d / %s | %s | %s | %.2f MiB | %s | %s | %s / %s |" % (
                    os.path.basename(path), batch, seq, "%dx%d" % size if size else "-", n, prec, ckpt, ft,
                    t["trainable"], m["trainable"] if m else "-", sv_t,
                    "%.2f MiB" % (m["saved"] / 2**20) if m and t["saved"] is not None else "-", t["peak"] / 2**20,
                    "%.2f MiB" % (m["peak"] / 2**20) if m else "refused",
                    "%+.3f%%" % (100.0 * (m["peak"] - t["peak"]) / t["peak"]) if m else "-", t["peak_at"],
                    m["peak_at"] if m else "-")
                print(row, flush=True)
                lines.append(row)
                if not m:
                    continue
                figures = {"trainable_params": rowlib.figure(t["trainable"], m["trainable"]),
                           "peak": rowlib.figure(t["peak"], m["peak"])}
                if t["saved"] is not None:
                    figures["saved"] = rowlib.figure(t["saved"], m["saved"])
                _save_image_row("qwenvl", path, m, figures)
    if out:
        rowlib.write_results(out, "# bench/accuracy/peft_step.py qwenvl: Qwen2-VL / Qwen2.5-VL with images, CPU "
                             "FakeTensorMode, torch %s, transformers %s, peft %s\n\n%s\n" % (
                                 torch.__version__, transformers.__version__, peft.__version__, "\n".join(lines)))


# (config, batch, seq, rows of (precision, checkpoint, LoRA r, targets or "frozen-tower", full))
MLLAMA_SETTINGS = [
    ("bench/accuracy/multimodal/mllama-shrunk.json", 2, 256, [
        ("bf16", "none", 0, None, True), ("bf16", "layers", 0, None, True), ("amp-bf16", "none", 0, None, True),
        ("amp-bf16", "layers", 0, None, True), ("bf16", "none", 16, "all-linear", False),
        ("bf16", "layers", 16, "all-linear", False), ("bf16", "none", 0, "frozen-tower", True),
        ("bf16", "layers", 0, "frozen-tower", True)]),
    ("bench/accuracy/multimodal/mllama-11b-shaped.json", 1, 1024, [
        ("bf16", "none", 0, None, True), ("bf16", "layers", 0, None, True), ("amp-bf16", "layers", 0, None, True),
        ("bf16", "layers", 16, "all-linear", False), ("bf16", "layers", 0, "frozen-tower", True)]),
]


def mllama_bench(out=None, only=(), memplan="./memplan"):
    """Llama 3.2 Vision (mllama) steps with one image a sample: MllamaProcessor's batch
    (mllama_image_inputs) through MllamaForConditionalGeneration under FakeTensorMode, beside the
    same step text-only (images 0: the cross-attention layers skipped), and memplan --images 1 on
    each (the frozen tower: --finetune freeze of every text layer, embed and head).  Rows go to
    rows/peft_step.jsonl; results: mllama_images_results.md."""
    import tempfile
    import peft
    import torch
    import transformers
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rowlib
    tmpdir = tempfile.mkdtemp(prefix="peft_mllama_")
    lines = ["| config | batch x seq | images | precision | ckpt | finetune | trainable | saved | peak | peak at |",
             "|" + "---|" * 10]
    for path, batch, seq, rows in MLLAMA_SETTINGS:
        if only and not any(o in path for o in only):
            continue
        cfg, d = bench_config(path, tmpdir)
        for prec, ckpt, r, tg, full in rows:
            frozen = tg == "frozen-tower"
            for n in (0, 1) if not frozen else (1,):
                t = torch_lora_step(cfg, batch, seq, prec, ckpt, r, None if frozen else tg, full, images=n,
                                    freeze_vision=frozen)
                ft = "full, frozen tower" if frozen else "full" if full else "lora r%d %s" % (r, tg)
                tb = "0-%d,embed,head" % (d["text_config"]["num_hidden_layers"] - 1) if frozen else None
                m = memplan_lora(path, batch, seq, prec, ckpt, r, None if frozen else tg, full, memplan=memplan,
                                 images=n, train_blocks=tb)
                figures = {"trainable_params": rowlib.figure(t["trainable"], m["trainable"]),
                           "peak": rowlib.figure(t["peak"], m["peak"])}
                if t["saved"] is not None:
                    figures["saved"] = rowlib.figure(t["saved"], m["saved"])
                _save_image_row("mllama", path, m, figures)
                row = "| %s | %d x %d | %d | %s | %s | %s | %d | %s | %.2f MiB | %s |" % (
                    os.path.basename(path), batch, seq, n, prec, ckpt, ft, t["trainable"],
                    "%.2f MiB" % (t["saved"] / 2**20) if t["saved"] is not None else "-", t["peak"] / 2**20,
                    t["peak_at"])
                print(row, flush=True)
                lines.append(row)
    if out:
        rowlib.write_results(out, "# bench/accuracy/peft_step.py mllama: Llama 3.2 Vision with images, torch side, "
                             "CPU FakeTensorMode, torch %s, transformers %s, peft %s\n\n%s\n" % (
                                 torch.__version__, transformers.__version__, peft.__version__, "\n".join(lines)))


def main(argv):
    if len(argv) >= 1 and argv[0] == "images":
        images_bench(argv[argv.index("--out") + 1] if "--out" in argv else None,
                     argv[argv.index("--memplan") + 1] if "--memplan" in argv else "./memplan",
                     only=argv[argv.index("--only") + 1].split(",") if "--only" in argv else ())
        return 0
    if len(argv) >= 1 and argv[0] == "qwenvl":
        qwenvl_bench(argv[argv.index("--out") + 1] if "--out" in argv else None,
                     argv[argv.index("--only") + 1].split(",") if "--only" in argv else (),
                     argv[argv.index("--memplan") + 1] if "--memplan" in argv else "./memplan")
        return 0
    if len(argv) >= 1 and argv[0] == "mllama":
        mllama_bench(argv[argv.index("--out") + 1] if "--out" in argv else None,
                     argv[argv.index("--only") + 1].split(",") if "--only" in argv else (),
                     argv[argv.index("--memplan") + 1] if "--memplan" in argv else "./memplan")
        return 0
    if len(argv) >= 1 and argv[0] == "lora":
        out = argv[argv.index("--out") + 1] if "--out" in argv else None
        only = argv[argv.index("--only") + 1].split(",") if "--only" in argv else ()
        skip = int(argv[argv.index("--skip") + 1]) if "--skip" in argv else 0
        lora_bench("--quick" in argv, out, only, skip)
        return 0
    if len(argv) >= 1 and argv[0] == "lora-packing":
        lora_packing_bench(argv[argv.index("--out") + 1] if "--out" in argv else None,
                           argv[argv.index("--only") + 1].split(",") if "--only" in argv else ())
        return 0
    if len(argv) >= 1 and argv[0] == "recompute":
        recompute_bench(argv[argv.index("--out") + 1] if "--out" in argv else None,
                        argv[argv.index("--only") + 1].split(",") if "--only" in argv else (),
                        argv[argv.index("--memplan") + 1] if "--memplan" in argv else "./memplan",
                        int(argv[argv.index("--show") + 1]) if "--show" in argv else 0, "--no-save" not in argv)
        return 0
    if len(argv) >= 1 and argv[0] == "bf16-amp":
        bf16_amp_bench(argv[argv.index("--out") + 1] if "--out" in argv else None,
                       argv[argv.index("--only") + 1].split(",") if "--only" in argv else (),
                       argv[argv.index("--memplan") + 1] if "--memplan" in argv else "./memplan")
        return 0
    if len(argv) >= 1 and argv[0] == "seq2seq-lora":
        seq2seq_lora_bench(argv[argv.index("--out") + 1] if "--out" in argv else None,
                           argv[argv.index("--memplan") + 1] if "--memplan" in argv else "./memplan")
        return 0
    if len(argv) >= 1 and argv[0] == "qlora-step":
        trl = "--trl" in argv[1:]  # TRL's cast and head, all-linear adapters (qlora_step)
        print("| precision | ckpt | trainable torch / memplan | peak torch | peak memplan | diff | losses |")
        print("|---|---|---|---|---|---|---|")
        for prec, ckpt in (("fp32", "none"), ("fp32", "layers"), ("amp-bf16", "none"), ("amp-bf16", "layers")):
            r = qlora_step(prec, ckpt, trl=trl, targets="all-linear" if trl else None)
            print("| %s | %s | %d / %d | %d | %d | %+.2f%% | %s |" % (
                prec, ckpt, r["trainable"], r["m_trainable"], r["peak"], r["m_peak"],
                100.0 * (r["m_peak"] - r["peak"]) / r["peak"], " ".join("%.4f" % l for l in r["losses"])), flush=True)
        return 0
    if len(argv) >= 1 and argv[0] == "params":
        params_bench(argv[1:])
        return 0
    if len(argv) >= 1 and argv[0] == "qlora-bytes":
        paths = argv[1:] or ["models/hf/llama-3-8b.json", "models/hf/llama-2-70b.json"]
        print(f"{'config':36} {'bitsandbytes':>16} {'memplan':>16}  diff   (quantized Linears / fp32 rest; "
              "memplan less its fp32 adapters)")
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bitsandbytes
        import rowlib
        import torch
        import transformers
        rows = []
        for p in paths:
            total, q, other, shapes = qlora_bytes(p)
            args = ["--seq", "16", "--finetune", "qlora", "--json"]
            out = subprocess.run(["./memplan", "estimate", p] + args, check=True, capture_output=True,
                                 text=True).stdout
            j = json.loads(out)
            mp = j["memory"]["weights_bytes"] - 4 * j["model"]["trainable_params"]
            print(f"{p:36} {total:16,d} {mp:16,d}  {mp - total:+d}   ({q:,d} / {other:,d})")
            rows.append(dict(config=p, max_layers=0, args=args, source="bench/accuracy/peft_step.py qlora-bytes",
                             figures={"qlora_base": rowlib.figure(total, mp)},
                             recorded={"quantized_linears": q, "fp32_rest": other},
                             versions=rowlib.run_versions(torch=torch.__version__,
                                                          transformers=transformers.__version__,
                                                          bitsandbytes=bitsandbytes.__version__)))
        rowlib.save_rows("peft_step", rows)
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
