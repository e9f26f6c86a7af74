"""timeline_check.py SVG JSON [probe]: the --timeline picture agrees with the --json report.

Exit 0 when it does; otherwise prints the first disagreement and exits 1.  The
expected values come from the JSON report (a separate code path: the estimator's
counting visitor), never from the SVG writer itself.
"""
import json
import math
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"
ORDER = ["setup", "forward", "loss", "recompute", "backward", "optimizer.step", "end"]


def fail(msg):
    sys.exit("timeline: " + msg)


svg_path, json_path = sys.argv[1], sys.argv[2]
probe = len(sys.argv) > 3 and sys.argv[3] == "probe"
try:
    root = ET.parse(svg_path).getroot()  # well-formed XML, or a ParseError
except ET.ParseError as e:
    fail("not well-formed XML: %s" % e)
with open(json_path) as f:
    rep = json.load(f)
mem = rep["memory"]
if root.tag != NS + "svg":
    fail("root element is %s, not svg" % root.tag)

# self-contained: no script, nothing fetched (every reference is to an id in the file)
for el in root.iter():
    if el.tag.split("}")[-1] in ("script", "image", "foreignObject", "use"):
        fail("a <%s> element: the picture must be self-contained" % el.tag.split("}")[-1])
    for k, v in el.attrib.items():
        if k.split("}")[-1] == "href" or k.startswith("on") or ("url(" in v and "url(#" not in v):
            fail("%s=%r on <%s>: the picture must be self-contained" % (k, v, el.tag.split("}")[-1]))

peak = root.find(".//%sg[@id='peak']" % NS)
if peak is None:
    fail("no peak marker")
if int(peak.get("data-bytes")) != mem["peak_allocated_bytes"]:
    fail("peak %s != peak_allocated_bytes %d" % (peak.get("data-bytes"), mem["peak_allocated_bytes"]))
if peak.get("data-label") != mem["peak_event"]:
    fail("peak label %r != peak_event %r" % (peak.get("data-label"), mem["peak_event"]))
texts = " ".join("".join(t.itertext()) for t in peak.iter(NS + "text"))
if mem["peak_event"] not in texts:
    fail("the peak's text %r does not name %r" % (texts, mem["peak_event"]))

# the phases tile the events in order: setup first, then forward ... optimizer step
phases = [(int(r.get("data-first-event")), int(r.get("data-last-event")), r.get("data-phase"))
          for r in root.iter(NS + "rect") if r.get("class") == "phase"]
n_ev = int(root.get("data-events"))
if not phases or phases[0][0] != 0 or phases[-1][1] != n_ev - 1:
    fail("phase bands do not cover events 0..%d" % (n_ev - 1))
for (a0, a1, pa), (b0, b1, pb) in zip(phases, phases[1:]):
    if b0 != a1 + 1 or b1 < b0:
        fail("phase bands not contiguous: %s [%d,%d] then %s [%d,%d]" % (pa, a0, a1, pb, b0, b1))
seen = [p for _, _, p in phases]
if seen[0] != "setup" or "forward" not in seen or "loss" not in seen or "backward" not in seen:
    fail("phases %s" % seen)
first = {p: seen.index(p) for p in set(seen)}
for a, b in (("setup", "forward"), ("forward", "loss"), ("loss", "backward")):
    if first[a] > first[b]:
        fail("%s after %s" % (a, b))
if "optimizer.step" in first and first["optimizer.step"] < max(i for i, p in enumerate(seen) if p == "backward"):
    fail("optimizer step before the last backward")
# the optimizer step is marked: its band, or (a step that allocates nothing, DeepSpeed's
# fused Adam) a mark after the last backward event
marks = [int(l.get("data-event")) for l in root.iter(NS + "line") if l.get("class") == "step-mark"]
last_bwd = max(b for a, b, p in phases if p == "backward")
if ("optimizer.step" in first) == bool(marks) or (marks and marks[0] <= last_bwd):
    fail("optimizer step: band %s, marks %s (last backward event %d)" % ("optimizer.step" in first, marks, last_bwd))
pe = int(peak.get("data-event"))
inside = [p for a, b, p in phases if a <= pe <= b]
# (GRPO's generate peak is named by generate.c: "generate:decode ..." in the generation band)
if inside != [{"generate": "generation"}.get(mem["peak_event"].split(":")[0], mem["peak_event"].split(":")[0])]:
    fail("peak event %d lies in phase %s, the report says %s" % (pe, inside, mem["peak_phase"]))

# DPO / KTO: the no-grad forwards compute_loss runs are drawn where they run, each a bracket over
# its events: the reference's (DPO one, KTO two) inside the loss, KTO's KL forward in the forward
cfg = rep.get("config", {})
splices = [(int(r.get("data-first-event")), int(r.get("data-last-event")), r.get("data-what"))
           for r in root.iter(NS + "rect") if r.get("class") == "splice"]
trainer = cfg.get("trainer", "sft")
# TRL 1.16: KTO's KL forward of the policy, then its two reference forwards; DPO's and KTO's
# apo_zero_unpaired's one (no KL term)
want = ["kl.forward"] if trainer == "kto" else []
# GRPO: generate (transformers', unless vLLM generates), the old log-probs' forward of the policy,
# the reference's, all before the step in the generation band
grpo = cfg.get("grpo") or {}
if trainer == "grpo":
    want = (["generate"] if grpo.get("vllm") == "none" else []) + \
        (["policy.forward"] if grpo.get("old_logprobs_forward") else [])
if cfg.get("reference") not in (None, "none", "precomputed"):
    want += ["reference.forward"] * {"dpo": 1, "kto": 2, "kto-apo": 1, "grpo": 1}.get(trainer, 0)
if [w for _, _, w in splices] != want:
    fail("spliced forwards %s, expected %s (trainer %s, reference %s)"
         % ([w for _, _, w in splices], want, trainer, cfg.get("reference")))
for a, b, w in splices:
    # (LLaMA-Factory's KTO, --loss hf: its KL forward runs in compute_loss, after the batch's forward)
    lf = trainer == "kto" and cfg.get("loss") == "hf"
    ph = "generation" if trainer == "grpo" else "loss" if w == "reference.forward" or lf else "forward"
    if [p for p0, p1, p in phases if p0 <= a and b <= p1] != [ph]:
        fail("the %s bracket [%d, %d] is not inside one %s band" % (w, a, b, ph))
if mem["peak_event"].startswith(("loss:reference.forward:", "generation:reference.forward:")) and \
        not any(a <= pe <= b for a, b, w in splices if w == "reference.forward"):
    fail("the peak is the reference forward's, but event %d is in no reference bracket" % pe)
if mem["peak_event"].startswith("generate:") and not any(a <= pe <= b for a, b, w in splices if w == "generate"):
    fail("the peak is generation's, but event %d is in no generate bracket" % pe)

# the categories at the peak add up to the peak
cats = [int(r.get("data-bytes-at-peak")) for r in root.iter(NS + "rect") if r.get("class") == "legend"]
if len(cats) < 6 or sum(cats) != mem["peak_allocated_bytes"]:
    fail("legend categories sum to %d, peak %d" % (sum(cats), mem["peak_allocated_bytes"]))

# grid labels, per panel (the main plot, then the zoom): one unit, a round step (1, 2 or 5
# times a power of ten of it), evenly spaced
def grid_labels(els):
    out = []
    for t in els:
        if t.get("class") == "grid":
            num, unit = "".join(t.itertext()).split(" ")
            out.append((float(num), unit))
    return out


inset_el = root.find(".//%sg[@id='inset']" % NS)
in_inset = set(id(t) for t in inset_el.iter(NS + "text")) if inset_el is not None else set()
panels = [grid_labels(t for t in root.iter(NS + "text") if id(t) not in in_inset),
          grid_labels(t for t in root.iter(NS + "text") if id(t) in in_inset)]
panels = [pl for pl in panels if pl]
if len(panels) != 2:
    fail("%d panels of grid labels, expected the plot and the zoom" % len(panels))
for pl in panels:
    units = {u for v, u in pl if v != 0}
    steps = [b[0] - a[0] for a, b in zip(pl, pl[1:])]
    if len(units) > 1 or not steps or max(steps) - min(steps) > 1e-6 * max(steps):
        fail("grid labels %s" % pl)
    mant = steps[0] / 10 ** math.floor(math.log10(steps[0]) + 1e-9)
    if min(abs(mant - r) for r in (1, 2, 5)) > 1e-6:
        fail("grid step %g is not 1, 2 or 5 times a power of ten" % steps[0])

# collective buffers: only with data parallelism; under DDP they are its buckets, all persistent
coll = [int(r.get("data-bytes-at-peak")) for r in root.iter(NS + "rect")
        if r.get("class") == "legend" and r.get("data-category") == "collective buffers"]
par = rep["config"].get("parallel")
if not par and coll:
    fail("collective buffers in the legend of a run without data parallelism")
if par and par["strategy"] == "ddp" and coll != [mem["buffers_bytes"]]:
    fail("DDP: collective buffers at the peak %s, the report's buckets %d" % (coll, mem["buffers_bytes"]))

# recomputed forwards are shaded exactly when the plan recomputes
recompute = [r for r in root.iter(NS + "rect") if r.get("class") == "recompute"]
if bool(recompute) != (mem["recompute_flops"] > 0):
    fail("%d recompute bands, recompute_flops %s" % (len(recompute), mem["recompute_flops"]))

hatch = [r for r in root.iter(NS + "rect") if r.get("class") == "legend-recompute"]
if bool(hatch) != (mem["recompute_flops"] > 0):
    fail("'recomputed forward' in the legend: %s, recompute_flops %s" % (bool(hatch), mem["recompute_flops"]))

# the zoom's op labels: a forward after the loss is named a recompute, and only there
for t in root.iter(NS + "text"):
    if t.get("class") != "op":
        continue
    ev, word = int(t.get("data-event")), "".join(t.itertext()).split(" ")[0]
    at = [p for a, b, p in phases if a <= ev <= b]
    if (word == "recompute") != (at == ["recompute"]) or (word == "forward" and at[0] not in ("setup", "forward")):
        fail("zoom label %r at event %d, in phase %s" % ("".join(t.itertext()), ev, at))

cap = root.find(".//%sline[@id='capacity']" % NS)
tgt = rep.get("target")
if tgt and tgt.get("capacity_bytes"):
    if cap is None or int(cap.get("data-bytes")) != tgt["capacity_bytes"]:
        fail("capacity line %s, target capacity %d" % (None if cap is None else cap.get("data-bytes"),
                                                         tgt["capacity_bytes"]))
    if root.find(".//%sline[@id='usable']" % NS) is None:
        fail("no margin (usable) line with a target")
elif cap is not None:
    fail("a capacity line without a target")

inset = root.find(".//%sg[@id='inset']" % NS)
if inset is None or not int(inset.get("data-first-event")) <= pe <= int(inset.get("data-last-event")):
    fail("the zoom does not contain the peak")

# the caching allocator's reserved bytes: a line exactly where it was simulated, over the same
# events, its peak the report's peak reserved (the steady step's: the same where nothing retried)
res = root.find(".//%spolyline[@id='reserved']" % NS)
al = mem.get("allocator") or {}
if bool(al.get("simulated")) != (res is not None):
    fail("reserved line %s, allocator simulated %s" % (res is not None, al.get("simulated")))
if res is not None:
    rp = int(res.get("data-peak-bytes"))
    if int(res.get("data-events")) != n_ev or rp < mem["peak_allocated_bytes"] or rp > mem["peak_reserved_bytes"] \
            or (al.get("num_alloc_retries") == 0 and rp != mem["peak_reserved_bytes"]):
        fail("reserved line: peak %d over %s events; the report: reserved %d, allocated %d, %d events"
             % (rp, res.get("data-events"), mem["peak_reserved_bytes"], mem["peak_allocated_bytes"], n_ev))
    if root.find(".//%srect[@class='legend-reserved']" % NS) is None:
        fail("the reserved line is not in the legend")

if probe:
    m = root.find(".//%spolyline[@id='measured']" % NS)
    if m is None:
        fail("no measured curve")
    if int(m.get("data-peak-bytes")) != rep["probe"]["measured_peak_bytes"]:
        fail("measured curve peak %s != probe.measured_peak_bytes %d"
             % (m.get("data-peak-bytes"), rep["probe"]["measured_peak_bytes"]))
    got_ev = int(m.get("data-events"))
    stop = root.find(".//%spath[@class='probe-stop']" % NS)
    if rep["probe"]["fits"]:
        if got_ev != n_ev or stop is not None:
            fail("measured curve has %d events (stop mark: %s), the replay %d" % (got_ev, stop is not None, n_ev))
    else:
        # out of memory: the curve ends at its last event on the replay's axis, marked
        bands = sorted((float(r.get("x")), float(r.get("width"))) for r in root.iter(NS + "rect")
                       if r.get("class") == "phase")
        x0, x1 = bands[0][0], bands[-1][0] + bands[-1][1]
        xs = [float(pt.split(",")[0]) for pt in m.get("points").split()]
        if not 0 < got_ev < n_ev or stop is None or max(xs) > x0 + (x1 - x0) * got_ev / n_ev + 0.1:
            fail("a probe out of memory after %d of %d events: curve to x=%.1f, stop mark %s"
                 % (got_ev, n_ev, max(xs), stop is not None))
print("ok")
