"""torch .bin import: archives written by the real `torch.save` read by the C reader through
tool_ckpt (dump, and copy to safetensors), plus damaged copies of them that must give a
clean error (exit 1 with a message), never a crash.

Prints PASS/FAIL/SKIP lines. Needs $GLM_BUILD/tests/tool_ckpt and torch."""
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

BUILD = harness.BUILD
TOOL = harness.tool("tool_ckpt")
_checks = harness.Checks()
check = _checks.check


def run(*args):
    return subprocess.run([TOOL, *args], capture_output=True, text=True, errors="replace")


def dump(path):
    out = run("dump", "bin", path)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    res = {}
    for line in out.stdout.splitlines():
        name, dt, shape, hexs = line.split("\t")
        res[name] = (dt, tuple(int(x) for x in shape.split(",")) if shape else (), bytes.fromhex(hexs))
    return res


def compare(got, tensors, torch):
    """Mismatches between tool_ckpt's dump and the tensors saved (floats as float32 bits)."""
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64", torch.int64: "I64",
             torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
    bad = []
    if set(got) != set(tensors):
        bad.append(f"names {sorted(got)} vs {sorted(tensors)}")
    for k, t in tensors.items():
        if k not in got:
            continue
        dt, shape, payload = got[k]
        t = t.detach()
        if dt != names[t.dtype] or shape != tuple(t.shape):
            bad.append(f"{k}: {dt}{shape} vs {t.dtype}{tuple(t.shape)}")
            continue
        if t.is_floating_point():
            want = t.float().contiguous().numpy().reshape(-1)
            have = np.frombuffer(payload, "<f4")
            ok = have.shape == want.shape and bool(np.all((have.view(np.uint32) == want.view(np.uint32)) | (np.isnan(have) & np.isnan(want))))
        else:
            ok = payload == t.contiguous().numpy().tobytes()
        if not ok:
            bad.append(f"{k}: values differ")
    return bad


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"SKIP tbin_torch_interop: {TOOL} not built")
        return 0
    try:
        import torch
    except ImportError as e:
        print(f"SKIP tbin_torch_interop: torch not importable ({e})")
        return 0
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as d:
        # 1. A module's state_dict (OrderedDict of Parameters/buffers) in fp32, fp16 and bf16.
        m = torch.nn.Sequential(torch.nn.Embedding(11, 6), torch.nn.LayerNorm(6), torch.nn.Linear(6, 5))
        m.register_buffer("steps", torch.tensor([3, -4], dtype=torch.int64))
        m.register_buffer("mask", torch.tensor([True, False, True]))
        for dt in (torch.float32, torch.float16, torch.bfloat16):
            sd = {k: (v.to(dt) if v.is_floating_point() else v) for k, v in m.state_dict().items()}
            sd = type(m.state_dict())(sd)  # keep the OrderedDict (+ _metadata) shape torch writes
            sd._metadata = m.state_dict()._metadata
            p = os.path.join(d, f"model_{str(dt)[6:]}.bin")
            torch.save(sd, p)
            try:
                bad = compare(dump(p), sd, torch)
            except RuntimeError as e:
                bad = [str(e)]
            check(f"tbin_state_dict_{str(dt)[6:]}", not bad, "; ".join(bad[:4]))

        # 2. Views sharing one storage: offset, strided, transposed; nn.Parameter in a plain dict.
        base = torch.arange(40, dtype=torch.float32) * 0.25 - 3
        grid = base.view(5, 8)
        views = {"base": base, "offset_view": base[10:17], "column": grid[:, 3], "transposed": grid.t(),
                 "block": grid[1:4, 2:6], "param": torch.nn.Parameter(torch.randn(3, 4, dtype=torch.float16)),
                 "half_t": torch.randn(6, 7).half().t()}
        p = os.path.join(d, "views.bin")
        torch.save(views, p)
        try:
            bad = compare(dump(p), views, torch)
        except RuntimeError as e:
            bad = [str(e)]
        check("tbin_shared_storage_views", not bad, "; ".join(bad[:4]))

        # 3. Sharded with pytorch_model.bin.index.json, opened through the folder.
        sd_dir = os.path.join(d, "sharded")
        os.mkdir(sd_dir)
        tensors = {f"transformer.layers.{i}.w": torch.randn(4, 3).half() for i in range(5)}
        tensors["lm_head.weight"] = torch.randn(7, 3).half()
        names = sorted(tensors)
        wm = {}
        for i, part in enumerate([names[:3], names[3:]]):
            fn = f"pytorch_model-{i + 1:05d}-of-00002.bin"
            torch.save({k: tensors[k] for k in part}, os.path.join(sd_dir, fn))
            wm.update({k: fn for k in part})
        json.dump({"metadata": {"total_size": 123}, "weight_map": wm}, open(os.path.join(sd_dir, "pytorch_model.bin.index.json"), "w"))
        try:
            bad = compare(dump(sd_dir), tensors, torch)
        except RuntimeError as e:
            bad = [str(e)]
        check("tbin_sharded_index", not bad, "; ".join(bad[:4]))

        # 4. .bin -> safetensors through C (raw copy keeps dtypes, views made contiguous).
        try:
            import safetensors.torch as stt
            out = run("copy", "bin", p, os.path.join(d, "views.safetensors"), "0")
            got = stt.load_file(os.path.join(d, "views.safetensors")) if out.returncode == 0 else {}
            same = set(got) == set(views) and all(torch.equal(got[k], v.detach()) for k, v in views.items())
            check("tbin_to_safetensors_matches_torch", same, out.stderr)
        except ImportError:
            print("SKIP tbin_to_safetensors_matches_torch: safetensors not importable")

        # 5. Damaged copies: truncations everywhere and byte flips; exit 1 with a message, never a signal.
        good = open(p, "rb").read()
        rnd = random.Random(1)
        crashes, silent, tried = [], 0, 0
        cuts = sorted(set(list(range(0, len(good), max(1, len(good) // 40))) + [len(good) - 1, len(good) - 22, 4, 30]))
        cases = [("cut", c, good[:c]) for c in cuts]
        for i in range(60):
            b = bytearray(good)
            for _ in range(rnd.randint(1, 4)):
                b[rnd.randrange(len(b))] = rnd.randrange(256)
            cases.append(("flip", i, bytes(b)))
        bad_path = os.path.join(d, "damaged.bin")
        for kind, where, data in cases:
            open(bad_path, "wb").write(data)
            out = run("dump", "bin", bad_path)
            tried += 1
            if out.returncode not in (0, 1):
                crashes.append(f"{kind}@{where}: exit {out.returncode} {out.stderr[-200:]}")
            elif out.returncode == 1 and (bad_path not in out.stderr or "error:" not in out.stderr):
                silent += 1
        check("tbin_damaged_archives_fail_cleanly", not crashes and silent == 0, f"{len(crashes)} crashes of {tried}: {crashes[:2]}; {silent} without a message")
        cut = os.path.join(d, "cut.bin")
        open(cut, "wb").write(good[: len(good) // 2])
        out = run("dump", "bin", cut)
        check("tbin_truncated_real_file", out.returncode == 1 and cut in out.stderr and "truncated" in out.stderr, out.stderr)
    return _checks.status()


if __name__ == "__main__":
    sys.exit(main())
