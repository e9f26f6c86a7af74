"""gpu_json.py - the frame the small GPU measurements share (sdpa_ws.py, optim_step.py): the
result file, rewritten whole after every row so that a run cut short keeps what it measured,
and the answer on a machine without CUDA."""
import json
import os


def start(out, key):
    """The result: {"status": "partial", key: [], device, torch}; None where CUDA is absent, the
    file then saying {"status": "skipped"}."""
    import torch
    res = {"status": "partial", key: []}
    if not torch.cuda.is_available():
        res["status"] = "skipped"
        save(out, res)
        return None
    res.update(device=torch.cuda.get_device_name(0), torch=torch.__version__)
    return res


def save(out, res):
    """res into out, whole (a temporary renamed over it)."""
    with open(out + ".tmp", "w") as f:
        json.dump(res, f, indent=0)
    os.replace(out + ".tmp", out)
