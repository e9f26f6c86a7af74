#!/usr/bin/env python3
"""inplace_tracker.py — a live-storage tracker that counts autograd's gradient sums as plain PyTorch
makes them (orpo_step.py and remeasure_rows.py use it; the older rows were measured with
torch_step.LiveTracker / dpo_step.RealTracker).

  python3 bench/accuracy/inplace_tracker.py      # the two trackers on small graphs, and torch's own choice

Plain PyTorch sums two incoming gradients of one tensor in place when it can
(torch/csrc/autograd/input_buffer.cpp InputBuffer::accumulate: buffer[pos] = old_var.add_(var) when
can_accumulate_inplace(old_var): dense, not a subclass, zero or nested tensor, and the buffer holds
the only reference to it and to its storage).  Under any TorchDispatchMode, isTensorSubclassLike is
true for every tensor (ATen/TensorSubclassLikeUtils.h: dispatch_mode_enabled()), so the engine
dispatches aten.add.Tensor(old_var, var) and holds both inputs until the sum exists: a tracker built
on a dispatch mode (dpo_step.RealTracker) counts one gradient-sized tensor more wherever two
gradient branches meet (TRL's ORPO loss: two [2b, s, V] logits gradients, 32,896,000 B on
dpo_step's tiny Llama at 2 pairs x 257 tokens, bf16).

InplaceTracker keeps every count of RealTracker (the bytes live after each event are the same) but
holds back the peak of such a sum until it knows what torch would have done: a post hook on every
backward node (torch.autograd.graph.node_creation_hook) marks the moment the engine adds that
node's outputs into input buffers; an aten.add.Tensor there whose first operand passes the
in-place conditions and whose storage dies at the next event was in place in plain PyTorch (the
engine held its last reference), so the transient never existed; otherwise the held-back moment
joins the peak.  Checked (2026-11-29, torch 2.15, CPU) against plain torch's choice (the profiler:
aten::add_ against aten::add) on residual blocks, y * y, h + h, expanded and hooked gradients, a
Python autograd.Function, three-way sums, and one ORPO step: the same in-place / out-of-place
decisions in every case, and the ORPO step's peak 296,660,480 B instead of 329,556,480 B, the
difference the allocator shows between no mode and a do-nothing mode.
"""
import os
import sys
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor  # noqa: E402

import dpo_step  # noqa: E402
from torch_step import round512  # noqa: E402

_ADD = torch.ops.aten.add.Tensor
# what counts as a plain tensor: under FakeTensorMode (torch_step's rows) a FakeTensor stands for the
# plain CUDA tensor it models (checked: fake and real runs of the tiny tied Llama make the same
# decisions and peaks, bench/accuracy/tied_sum_survey.md)
_PLAIN = (torch.Tensor, torch.nn.Parameter, FakeTensor)


def _inplace_candidate(old, var, out):
    """can_accumulate_inplace's conditions that can be checked before the sum (old_var's own
    reference count cannot: whether it dies right after decides, InplaceTracker._gone)."""
    return (type(old) in _PLAIN and type(var) in _PLAIN
            and old.layout == torch.strided and not old.is_nested and not old._is_zerotensor()
            and torch._prims_common.is_non_overlapping_and_dense_or_false(old)
            # storage().use_count() == 1: one TensorImpl (+1, the storage's Python object the tracker
            # made); a view whose base is alive makes it 3
            and torch._C._storage_Use_Count(old.untyped_storage()._cdata) == 2
            and old.untyped_storage()._cdata != var.untyped_storage()._cdata
            and old.shape == out.shape and old.dtype == out.dtype)


class InplaceTracker(dpo_step.RealTracker):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._acc_node = None  # the node whose outputs the engine is adding into input buffers
        self._pending = None   # (old_var's storage ref, cur with the sum, where, peak_live)
        self.acc = [0, 0]      # gradient sums counted [in place, out of place]

    def __enter__(self):
        r = super().__enter__()
        self._nch = torch.autograd.graph.node_creation_hook(self._on_node)
        self._nch.__enter__()
        return r

    def __exit__(self, *a):
        self._nch.__exit__(*a)
        self._settle()
        return super().__exit__(*a)

    def _on_node(self, node):
        if node.next_functions:  # (AccumulateGrad: no outputs to add)
            node.register_hook(self._post_hook)

    def _post_hook(self, grad_inputs, grad_outputs):
        # Engine::evaluate_function: the node ran (post hooks last), then InputBuffer::add for each
        # of its outputs while it is still the current autograd node
        self._settle()
        self._acc_node = torch._C._current_autograd_node()

    def _settle(self):
        """The pending sum was out of place after all: its moment joins the peak."""
        p, self._pending = self._pending, None
        if p is not None:
            self.acc[1] += 1
            if p[1] > self.peak:
                self.peak, self.peak_at = p[1], "%s:add (%s)" % (self.phase, p[2])
                if self.snapshot:
                    self.peak_live = p[3]

    def add(self, t, label="tensor"):
        self._settle()
        super().add(t, label)

    def _gone(self, n, ref):
        p = self._pending
        if p is not None and p[0] is ref:  # old_var died as the engine stored the sum: in place
            self._pending = None
            self.acc[0] += 1
        else:
            self._settle()
        super()._gone(n, ref)

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        self._settle()
        node = self._acc_node
        if node is None or func is not _ADD:
            return super().__torch_dispatch__(func, types_, args, kwargs)
        if torch._C._current_autograd_node() is not node or torch.is_grad_enabled():
            self._acc_node = None  # the next node runs (or create_graph: out of place)
            return super().__torch_dispatch__(func, types_, args, kwargs)
        old, var = args[0], args[1]
        out = func(*args, **(kwargs or {}))
        e = self._refs.get(old.untyped_storage())
        if (e is None or kwargs or not _inplace_candidate(old, var, out)
                or round512(out.untyped_storage().nbytes()) != e[1]):
            self.add(out, "add")
            self.acc[1] += 1
            return out
        kept = self.peak, self.peak_at, self.peak_live
        self.add(out, "add")  # cur as RealTracker counts it; the peak waits for _gone / _settle
        self._pending = (e[0], self.cur, node.name(), self.peak_live)
        self.peak, self.peak_at, self.peak_live = kept
        return out


def two_branches(V=16384):
    """One logits tensor read by two losses (ORPO's shape of graph): its two gradients meet."""
    w = torch.randn(8, V, requires_grad=True)
    h = torch.randn(4, 6, 8)
    logits = h @ w
    ids = torch.randint(0, V, (2, 5))
    ce = torch.nn.functional.cross_entropy(logits[:2][..., :-1, :].contiguous().view(-1, V), ids.view(-1))
    return ce + logits[:, :-1, :].log_softmax(-1).sum()


def residual(h=512):
    """x + mlp(norm(x)): x's two gradients meet."""
    x = torch.randn(64, h, requires_grad=True)
    lin = torch.nn.Linear(h, h)
    return (x + lin(torch.nn.functional.layer_norm(x, (h,)))).sum()


def torch_sums_in_place(make):
    """Plain PyTorch's choice (no mode): whether its backward ran aten::add_ (a sum in place) and
    aten::add (one out of place), from the profiler."""
    torch.manual_seed(0)
    loss = make()
    with torch.profiler.profile() as prof:
        loss.backward()
    names = {e.name for e in prof.events()}
    return "aten::add_" in names, "aten::add" in names


def backward_peak(make, cls):
    torch.manual_seed(0)
    tr = cls()
    with tr:
        loss = make()
        start = tr.peak = tr.cur
        loss.backward()
        peak = tr.peak - start
    return peak, getattr(tr, "acc", None)


def main():
    print("%-13s %-26s %14s %14s  %s" % ("graph", "plain torch (add_, add)", "RealTracker", "InplaceTracker",
                                         "in place / out of place"))
    for name, make in (("two branches", two_branches), ("residual", residual)):
        ip = torch_sums_in_place(make)
        r, _ = backward_peak(make, dpo_step.RealTracker)
        a, acc = backward_peak(make, InplaceTracker)
        print("%-13s %-26s %14d %14d  %d / %d" % (name, ip, r, a, acc[0], acc[1]))


if __name__ == "__main__":
    main()
