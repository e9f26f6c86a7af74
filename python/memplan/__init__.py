"""memplan: plan GPU memory for training before you launch, from Python.

    import memplan
    r = memplan.check("models/hf/llama-3.2-1b.json", gpu="a100-40gb", batch=8, finetune="lora")
    r.fits, r.check.shortfall_bytes, r.memory.peak_device_bytes

Each function runs the memplan binary installed with the package (`memplan COMMAND ... --json`)
and returns its report, schema 1 (README.md, "JSON output (schema 1)"), as dataclasses
(memplan._schema).  Keyword arguments are the command's options, as `memplan COMMAND --help`
lists them, with _ for -: grad_accum=4 is --grad-accum 4; a flag takes True/False (no_probe=True);
an on|off option takes a bool (use_cache=False); a list is joined with commas
(lora_targets=["q_proj", "v_proj"]); None leaves the option out.  A keyword the command does not
take raises TypeError.  memplan's failures (exit 2 usage, 3 bad input or a refused recipe key,
4 device, 5 internal) raise MemplanError with its one-line message and exit status; "does not
fit" (exit 1) is a result: check's `fits` is False, suggest's `recommendation` is None.

The API needs only the standard library.  memplan.integrations.transformers has a
transformers.TrainerCallback (it imports transformers and torch itself, only when imported).
"""
from ._errors import (EXIT_DEVICE, EXIT_DOES_NOT_FIT, EXIT_INPUT, EXIT_INTERNAL, EXIT_NO_BINARY, EXIT_OK,
                      EXIT_USAGE, MemplanError, SchemaError)
from ._run import Run, binary, options, report, version
from ._schema import (SCHEMA, Candidate, Check, CheckReport, CommPerStep, Config, EstimateReport, Finetune, Layer,
                      Memory, Model, Moe, Parallel, Plan, Recipe, RecipeSetting, Report, SuggestReport, Target,
                      from_dict, to_dict)

__all__ = [
    "estimate", "check", "suggest", "options", "binary", "version", "report", "MemplanError", "SchemaError",
    "Run", "SCHEMA", "Report", "EstimateReport", "CheckReport", "SuggestReport", "Model", "Config", "Finetune",
    "Moe", "Parallel", "Recipe", "RecipeSetting", "Target", "Memory", "CommPerStep", "Layer", "Plan", "Check",
    "Candidate", "from_dict", "to_dict", "EXIT_OK", "EXIT_DOES_NOT_FIT", "EXIT_USAGE", "EXIT_INPUT",
    "EXIT_DEVICE", "EXIT_INTERNAL", "EXIT_NO_BINARY",
]


def estimate(model=None, **options) -> EstimateReport:
    """`memplan estimate MODEL ...`: where one training step's memory goes, and its peak"""
    return report("estimate", model, **options)


def check(model=None, **options) -> CheckReport:
    """`memplan check MODEL ...`: whether it fits the target (gpu= or vram=); `.fits`"""
    return report("check", model, **options)


def suggest(model=None, **options) -> SuggestReport:
    """`memplan suggest MODEL ...`: the micro-batch, accumulation, checkpointing and precision to
    train with (`.recommendation`, None when nothing fits: `.alternatives` says what would)"""
    return report("suggest", model, **options)
