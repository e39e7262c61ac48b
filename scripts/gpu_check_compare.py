#!/usr/bin/env python3
"""scripts/gpu_check_compare.py - the number-crunching half of scripts/gpu-check.

Subcommands (each prints nothing on stdout but what it is asked for):

  parity PLAN --json OUT --md OUT [--tol-fp32 ...]
      PLAN is a tab-separated file, one line per check:
        parity  LABEL  PRECISION  WORLD  REF_DIR  RUN_DIR  RC  INIT_DIR
        sanity  LABEL  PRECISION  WORLD  ONE_STEP_DIR  TEN_STEP_DIR  RC  -
      Each *_DIR holds a strata-gpt run: metrics.csv and params.pt (--dump-params).
      parity: per-step losses and final parameters of RUN against REF. fp32:
      max |d param| <= --tol-fp32. bf16: the updates from INIT_DIR's parameters
      (the initial ones) in L2, |RUN - REF| / |REF - INIT| <= --update-rtol-bf16,
      as tests/strategies/parity_test.cpp does: Adam turns bf16 rounding noise in a
      near-zero gradient into steps of up to ~lr in single elements, so the
      element-wise difference is reported there but not judged.
      sanity: how far the reference's parameters moved between step 1 and step 10;
      it must be >= --sanity-factor x the parameter tolerance, or the tolerance
      could not tell a run that never stepped from one that did.
      Exit 1 if any line fails.

  throughput PLAN --json OUT --md OUT --gpu-name NAME --torch-version V [--peak-tflops X]
      PLAN lines: LABEL  WORLD  RUN_DIR  RC. Reads RUN_DIR/summary.json and
      RUN_DIR/config.ini; prints a Markdown table with strata's own MFU and one
      against the card's nominal bf16 dense peak.

  make-data DIR [--tokens N] [--vocab V]
      Writes nanoGPT-style DIR/train.bin and DIR/val.bin (uint16 little-endian)
      of random tokens: the throughput runs need GPT-2's vocabulary and 1024-token
      windows, which the built-in addition task does not have.

  merge OUT.json KEY=FILE.json ... KEY:=TEXT ...
      One JSON object from several (KEY=FILE.json) and plain strings (KEY:=TEXT).

Only `parity` needs torch (to read --dump-params archives); the rest is the
standard library, so it runs under any Python 3.8+.
"""
import argparse
import csv
import json
import math
import os
import random
import sys
import warnings
from array import array

# --- parameters ---------------------------------------------------------------


def load_params(path):
    """Name -> tensor from a strata --dump-params file.

    strata writes it with torch::serialize::OutputArchive (recipes/app/run.cpp,
    dump_params): a TorchScript archive of one method-less module whose
    attributes are the parameters, registered as parameters under their full
    dotted names ("transformer.h.0.attn.c_attn.weight"). Python reads such a
    file with torch.jit.load; its state_dict() lists the parameters. The dotted
    names and parameter flags cannot be produced from Python the same way, so
    this reader does not rely on one listing: state_dict() first, then every
    tensor attribute (torch._C's module iterator, which also sees attributes
    that are not registered as parameters), and finally torch.load for a plain
    dict of tensors (what a Python-made test file is).
    """
    import torch

    problems = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit.load's deprecation notice
            module = torch.jit.load(path, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - any failure moves on to torch.load
        problems.append("torch.jit.load: %s" % (str(e).splitlines()[0] if str(e) else type(e).__name__))
    else:
        found = dict(module.state_dict())
        if not found:
            iterators = torch._C._jit_debug_module_iterators(module._c)
            found = {k: v for k, v in iterators.get("named_attributes", []) if isinstance(v, torch.Tensor)}
        if found:
            return found
        problems.append("torch.jit.load: the archive holds no tensors")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001
        problems.append("torch.load: %s" % (str(e).splitlines()[0] if str(e) else type(e).__name__))
    else:
        if hasattr(obj, "state_dict") and not isinstance(obj, dict):
            obj = obj.state_dict()
        if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return dict(obj)
        problems.append("torch.load: not a dict of tensors (%s)" % type(obj).__name__)
    raise ValueError("cannot read parameters from %s: %s" % (path, "; ".join(problems)))


def param_diff(ref, other):
    """(max |ref - other| over all elements, name where it occurs, problem or None)."""
    if set(ref) != set(other):
        missing = sorted(set(ref) - set(other))[:3]
        extra = sorted(set(other) - set(ref))[:3]
        return math.inf, "", "parameter names differ (missing %s, extra %s)" % (missing, extra)
    worst, where = 0.0, ""
    for name in sorted(ref):
        a, b = ref[name], other[name]
        if tuple(a.shape) != tuple(b.shape):
            return math.inf, name, "shape %s vs %s" % (tuple(a.shape), tuple(b.shape))
        d = (a.double() - b.double()).abs()
        if not bool(d.isfinite().all()):
            return math.inf, name, "non-finite values"
        m = float(d.max()) if d.numel() else 0.0
        if m > worst:
            worst, where = m, name
    return worst, where, None


# --- losses -------------------------------------------------------------------


def read_losses(metrics_csv):
    """step -> train loss from strata's metrics.csv (rows without a loss, such as
    validation rows, are skipped)."""
    losses = {}
    with open(metrics_csv, newline="") as f:
        for row in csv.DictReader(f):
            cell = (row.get("loss") or "").strip()
            if cell:
                losses[int(row["step"])] = float(cell)
    return losses


def loss_diff(ref, other):
    """(max relative difference over the steps, step where, problem or None)."""
    if not ref:
        return math.inf, None, "no logged losses in the reference"
    if sorted(ref) != sorted(other):
        return math.inf, None, "logged steps differ: %s vs %s" % (sorted(ref), sorted(other))
    worst, where = 0.0, None
    for step in sorted(ref):
        a, b = ref[step], other[step]
        if not (math.isfinite(a) and math.isfinite(b)):
            return math.inf, step, "non-finite loss at step %d" % step
        rel = abs(a - b) / max(abs(a), 1e-12)
        if rel > worst:
            worst, where = rel, step
    return worst, where, None


# --- parity -------------------------------------------------------------------


def read_plan(path, columns):
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            cells = line.split("\t")
            if len(cells) != columns:
                raise SystemExit("%s:%d: expected %d tab-separated cells, got %d" % (path, number, columns, len(cells)))
            rows.append(cells)
    return rows


def update_error(ref, run, init):
    """|run - ref| / |ref - init| in L2 over the whole model: a run that never
    steps is 1.0 off, one with twice the update 1.0, a correct bf16 run ~0.01."""
    if set(init) != set(ref):
        raise ValueError("the initial parameters' names differ from the reference's")
    error2 = update2 = 0.0
    for name in ref:
        update = ref[name].double() - init[name].double()
        error2 += float((run[name].double() - ref[name].double()).pow(2).sum())
        update2 += float(update.pow(2).sum())
    if not update2 > 0.0:
        raise ValueError("the reference did not move from the initial parameters")
    return math.sqrt(error2 / update2)


def tolerances(args, precision):
    bf16 = precision.startswith("bf16")
    return (args.tol_bf16, args.loss_rtol_bf16) if bf16 else (args.tol_fp32, args.loss_rtol_fp32)


def check_parity_row(args, kind, label, precision, world, ref_dir, run_dir, rc, init_dir="-"):
    ptol, ltol = tolerances(args, precision)
    by_update = kind == "parity" and precision.startswith("bf16")
    result = {"kind": kind, "label": label, "precision": precision, "world_size": int(world),
              "ref": ref_dir, "run": run_dir, "param_tol": None if by_update else ptol, "loss_rtol": ltol}
    problems = []
    if rc != "0":
        problems.append("a run failed (exit %s; see gpu-check.log)" % rc)
    else:
        try:
            ref_p = load_params(os.path.join(ref_dir, "params.pt"))
            run_p = load_params(os.path.join(run_dir, "params.pt"))
            d, where, problem = param_diff(ref_p, run_p)
            result.update(max_abs_param_diff=d, worst_param=where, params=len(ref_p))
            if problem:
                problems.append(problem)
            elif kind == "sanity":
                need = args.sanity_factor * ptol
                result["movement_needed"] = need
                if not d >= need:
                    problems.append("parameters moved only %.3g between step 1 and step 10, less than "
                                    "%g x the tolerance (%.3g): raise the lr" % (d, args.sanity_factor, need))
            elif by_update:
                if init_dir == "-":
                    raise ValueError("a bf16 parity line needs the initial parameters (INIT_DIR)")
                u = update_error(ref_p, run_p, load_params(os.path.join(init_dir, "params.pt")))
                result.update(update_rel_error=u, update_rtol=args.update_rtol_bf16)
                if not u <= args.update_rtol_bf16:
                    problems.append("update error %.3g > %.3g (L2, relative to single's update)" % (u, args.update_rtol_bf16))
            elif not d <= ptol:
                problems.append("max abs d param %.3g > %.3g (%s)" % (d, ptol, where))
            if kind == "parity":
                ld, step, lproblem = loss_diff(read_losses(os.path.join(ref_dir, "metrics.csv")),
                                               read_losses(os.path.join(run_dir, "metrics.csv")))
                result.update(max_rel_loss_diff=ld, worst_loss_step=step)
                if lproblem:
                    problems.append(lproblem)
                elif not ld <= ltol:
                    problems.append("max rel d loss %.3g > %.3g (step %s)" % (ld, ltol, step))
        except (OSError, ValueError, KeyError) as e:
            problems.append(str(e))
    result["ok"] = not problems
    result["problems"] = problems
    return result


def fmt(x, spec=".2e"):
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, spec)


def parity_markdown(results, args):
    lines = ["| check | world | precision | max abs d param | tol | rel d update | tol | max rel d loss | tol "
             "| result |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r["kind"] == "sanity":
            tol = "moved >= %s" % fmt(r.get("movement_needed", args.sanity_factor * r["param_tol"]), ".1e")
            loss, ltol = "-", "-"
        else:
            tol, loss, ltol = fmt(r["param_tol"], ".0e"), fmt(r.get("max_rel_loss_diff")), fmt(r["loss_rtol"], ".0e")
        upd, utol = fmt(r.get("update_rel_error")), fmt(r.get("update_rtol"), ".0e")
        verdict = "ok" if r["ok"] else "**FAIL**: " + "; ".join(r["problems"])
        lines.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["label"], r["world_size"], r["precision"], fmt(r.get("max_abs_param_diff")), tol, upd, utol, loss, ltol,
            verdict.replace("|", "/")))
    return "\n".join(lines) + "\n"


def cmd_parity(args):
    results = [check_parity_row(args, *row) for row in read_plan(args.plan, 8)]
    ok = bool(results) and all(r["ok"] for r in results)
    settings = {k: getattr(args, k) for k in ("tol_fp32", "loss_rtol_fp32", "tol_bf16", "loss_rtol_bf16", "update_rtol_bf16",
                                              "sanity_factor")}
    write_json(args.json, {"ok": ok, "settings": settings, "checks": results})
    with open(args.md, "w") as f:
        f.write(parity_markdown(results, args))
    return 0 if ok else 1


# --- throughput ---------------------------------------------------------------

# Nominal dense bf16 tensor-core peaks (no sparsity), TFLOP/s, from NVIDIA's
# data sheets; matched against nvidia-smi's name in this order (the first
# substring that occurs wins, so the PCIe and NVL H100s come before the SXM).
NOMINAL_BF16_TFLOPS = [
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),   # SXM5 ("NVIDIA H100 80GB HBM3")
    ("H200", 989.0),
    ("H800", 989.0),
    ("A100", 312.0),
]


def nominal_peak_tflops(gpu_name):
    for key, tflops in NOMINAL_BF16_TFLOPS:
        if key.lower() in gpu_name.lower():
            return tflops
    return None


def read_ini(path):
    """key -> value from strata's config.ini ('key = value', '#' comments)."""
    values = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def flops_per_token(summary, ini):
    """strata's GPTModule::flops_per_token (recipes/models/gpt.cpp), nanoGPT's estimate:
    6 N + 12 L H Q T, N = parameters without the position embedding (T x C)."""
    layers, heads, width = int(ini["n-layer"]), int(ini["n-head"]), int(ini["n-embd"])
    block = int(ini["block-size"])
    n = float(summary["parameters"]) - block * width
    return 6.0 * n + 12.0 * layers * heads * (width // heads) * block


def throughput_row(label, world, run_dir, rc, peak_tflops):
    row = {"label": label, "world_size": int(world), "run": run_dir, "rc": int(rc)}
    if rc != "0":
        row["problem"] = "run failed (exit %s; see gpu-check.log)" % rc
        return row
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        ini = read_ini(os.path.join(run_dir, "config.ini"))
        fpt = flops_per_token(summary, ini)
    except (OSError, ValueError, KeyError) as e:
        row["problem"] = "cannot read the run's outputs: %s" % e
        return row
    ws = int(summary.get("world_size", world))
    tps = float(summary.get("tokens_per_s") or 0.0)
    tokens_per_step = ws * int(ini.get("batch-size", 0)) * int(ini.get("block-size", 0))
    gpus = ws * int(summary.get("tp_size", 1))  # world_size counts data-parallel ranks
    peaks = summary.get("peak_tensor_bytes") or []
    row.update(
        summary=summary,
        flops_per_token=fpt,
        tokens_per_s=tps,
        tokens_per_s_per_gpu=tps / gpus,
        ms_per_step=1000.0 * tokens_per_step / tps if tps > 0 else None,
        strata_mfu=summary.get("mfu"),
        strata_matmul_peak_tflops=(summary.get("matmul_peak_flops") or 0.0) / 1e12,
        mfu_nominal_bf16=(tps / gpus * fpt / (peak_tflops * 1e12)) if peak_tflops else None,
        peak_tensor_gib=max(peaks) / 2**30 if peaks else None,
        peak_rss_gib=max(summary.get("peak_rss_bytes") or [0]) / 2**30,
    )
    return row


def throughput_markdown(rows, gpu_name, torch_version, peak_tflops):
    peak = "%g TFLOP/s" % peak_tflops if peak_tflops else "unknown (set GPU_CHECK_PEAK_TFLOPS)"
    out = ["GPU: %s; nominal bf16 dense peak %s; torch %s." % (gpu_name, peak, torch_version), "",
           "strata mfu: strata's own field, against its own 4096^3 matmul probe on the device in the run's "
           "compute dtype (bf16 under bf16-mixed; until 2026-11-27 it probed fp32, so bf16 runs exceeded 1); "
           "MFU bf16: the same FLOPs (6 N + 12 L H Q T per token) against the nominal bf16 peak.", "",
           "| strategy | world | tokens/s | tokens/s/GPU | ms/step | strata mfu | probe TFLOP/s "
           "| MFU bf16 | peak tensor GiB | peak RSS GiB |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "problem" in r:
            out.append("| %s | %d | **FAIL**: %s | | | | | | | |" % (r["label"], r["world_size"], r["problem"]))
            continue
        out.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["label"], r["world_size"], fmt(r["tokens_per_s"], ",.0f"), fmt(r["tokens_per_s_per_gpu"], ",.0f"),
            fmt(r["ms_per_step"], ".1f"), fmt(r["strata_mfu"], ".3f"), fmt(r["strata_matmul_peak_tflops"], ".1f"),
            fmt(r["mfu_nominal_bf16"], ".1%"), fmt(r["peak_tensor_gib"], ".2f"), fmt(r["peak_rss_gib"], ".2f")))
    return "\n".join(out) + "\n"


def cmd_throughput(args):
    peak = args.peak_tflops or nominal_peak_tflops(args.gpu_name)
    rows = [throughput_row(*row, peak) for row in read_plan(args.plan, 4)]
    write_json(args.json, {"gpu": args.gpu_name, "torch": args.torch_version, "nominal_bf16_peak_tflops": peak,
                           "runs": rows})
    with open(args.md, "w") as f:
        f.write(throughput_markdown(rows, args.gpu_name, args.torch_version, peak))
    return 0 if all("problem" not in r for r in rows) else 1


# --- small tools --------------------------------------------------------------


def cmd_make_data(args):
    os.makedirs(args.dir, exist_ok=True)
    rng = random.Random(0)
    for name, count in (("train.bin", args.tokens), ("val.bin", max(args.tokens // 10, 4096))):
        tokens = array("H", (rng.randrange(args.vocab) for _ in range(count)))
        if sys.byteorder != "little":
            tokens.byteswap()
        with open(os.path.join(args.dir, name), "wb") as f:
            tokens.tofile(f)
    return 0


def cmd_merge(args):
    merged = {}
    for item in args.items:
        if ":=" in item:
            key, _, text = item.partition(":=")
            merged[key] = text
        elif "=" in item:
            key, _, path = item.partition("=")
            try:
                with open(path) as f:
                    merged[key] = json.load(f)
            except (OSError, ValueError) as e:
                merged[key] = {"error": "cannot read %s: %s" % (path, e)}
        else:
            raise SystemExit("merge: expected KEY=FILE.json or KEY:=TEXT, got '%s'" % item)
    write_json(args.out, merged)
    return 0


def write_json(path, obj):
    def clean(x):  # JSON has no inf/nan
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    with open(path, "w") as f:
        json.dump(clean(obj), f, indent=2)
        f.write("\n")


def main(argv):
    parser = argparse.ArgumentParser(prog="gpu_check_compare.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("parity")
    p.add_argument("plan")
    p.add_argument("--json", required=True)
    p.add_argument("--md", required=True)
    p.add_argument("--tol-fp32", type=float, default=1e-4)
    p.add_argument("--loss-rtol-fp32", type=float, default=1e-4)
    p.add_argument("--tol-bf16", type=float, default=5e-3)
    p.add_argument("--loss-rtol-bf16", type=float, default=5e-3)
    p.add_argument("--sanity-factor", type=float, default=5.0)
    p.add_argument("--update-rtol-bf16", type=float, default=0.1)
    p.set_defaults(run=cmd_parity)
    t = sub.add_parser("throughput")
    t.add_argument("plan")
    t.add_argument("--json", required=True)
    t.add_argument("--md", required=True)
    t.add_argument("--gpu-name", required=True)
    t.add_argument("--torch-version", required=True)
    t.add_argument("--peak-tflops", type=float, default=0.0, help="overrides the table of nominal peaks")
    t.set_defaults(run=cmd_throughput)
    d = sub.add_parser("make-data")
    d.add_argument("dir")
    d.add_argument("--tokens", type=int, default=1 << 20)
    d.add_argument("--vocab", type=int, default=50257)
    d.set_defaults(run=cmd_make_data)
    m = sub.add_parser("merge")
    m.add_argument("out")
    m.add_argument("items", nargs="*")
    m.set_defaults(run=cmd_merge)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
