"""gpu_json.py - the frame the small GPU measurements share (sdpa_ws.py, optim_step.py,
devbytes.py; kit.py's op recorder): the result file, rewritten whole after every row so that a
run cut short keeps what it measured, the answer on a machine without CUDA, and the recorder of
the aten ops a call dispatched to."""
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


def op_spy(keep):
    """A TorchDispatchMode whose .ops lists, in order, the aten op names (overload packets, e.g.
    "_scaled_dot_product_flash_attention") dispatched under it for which keep(name) is true."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Spy(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket.__name__)
            if keep(name):
                self.ops.append(name)
            return func(*args, **(kwargs or {}))
    return Spy()
