"""Event files written by C (tool_tensorboard) read back with TensorBoard's own reader.

Prints PASS/FAIL/SKIP lines like the C tests. Needs $GLM_BUILD/tests/tool_tensorboard and the
tensorboard package; SKIPs without them."""
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

BUILD = harness.BUILD
TOOL = harness.tool("tool_tensorboard")
_checks = harness.Checks()
check = _checks.check


def expected():
    """The scalar set tool_tensorboard writes (see its header comment), as float32."""
    exp = {"train/loss": [], "train/lr": [], "eval/loss": []}
    for s in range(40):
        exp["train/loss"].append((s, float(np.float32(10.0) / np.float32(s + 1))))
        exp["train/lr"].append((s * 7, float(np.float32(s) * np.float32(1e-5))))
        if s % 10 == 0:
            exp["eval/loss"].append((s + (1 << 40), float(-np.float32(s) / np.float32(3.0))))
    return exp


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"SKIP tb_python_reader: {TOOL} not built")
        return 0
    try:
        from tensorboard.backend.event_processing import event_file_loader
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c, masked_crc32c
    except Exception as e:  # noqa: BLE001 - any import problem means "not available here"
        print(f"SKIP tb_python_reader: tensorboard not importable ({e})")
        return 0
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([TOOL, "write", d], capture_output=True, text=True)
        check("tb_tool_writes", out.returncode == 0, out.stderr)
        if out.returncode != 0:
            return 1
        path = out.stdout.strip()
        base = os.path.basename(path).split(".")
        check("tb_file_name", base[:3] == ["events", "out", "tfevents"] and base[3].isdigit() and base[-1] == str(int(base[-1])),
              os.path.basename(path))

        # Framing and masked CRCs checked independently of the reader.
        data = open(path, "rb").read()
        i, nrec, bad = 0, 0, 0
        while i < len(data):
            (n,) = struct.unpack_from("<Q", data, i)
            (c1,) = struct.unpack_from("<I", data, i + 8)
            (c2,) = struct.unpack_from("<I", data, i + 12 + n)
            bad += c1 != masked_crc32c(data[i:i + 8]) or c2 != masked_crc32c(data[i + 12:i + 12 + n])
            i += 16 + n
            nrec += 1
        check("tb_masked_crc_matches_tensorboard", bad == 0 and i == len(data) and nrec == 1 + 40 + 40 + 4, f"{bad} bad of {nrec}")

        events = list(event_file_loader.EventFileLoader(path).Load())
        check("tb_first_event_file_version", events and events[0].file_version == "brain.Event:2",
              events[0] if events else "no events")
        check("tb_wall_time_plausible", all(abs(e.wall_time - events[0].wall_time) < 600 and e.wall_time > 1.5e9 for e in events))

        acc = EventAccumulator(d, size_guidance={"scalars": 0}, purge_orphaned_data=False)
        acc.Reload()
        exp = expected()
        tags = sorted(acc.Tags()["scalars"])
        check("tb_accumulator_tags", tags == sorted(exp), f"{tags}")
        for tag, want in exp.items():
            got = [(e.step, e.value) for e in acc.Scalars(tag)] if tag in tags else []
            check(f"tb_accumulator_values {tag}", got == want, f"got {got[:3]}... want {want[:3]}...")

    for hexs in ["", "00" * 32, "ff" * 32, bytes(range(256)).hex(), os.urandom(1000).hex()]:
        out = subprocess.run([TOOL, "crc", hexs], capture_output=True, text=True)
        want = crc32c(bytes.fromhex(hexs))
        if out.stdout.strip() != f"{want:08x}":
            check("tb_crc32c_matches_tensorboard", False, f"{hexs[:16]}: {out.stdout.strip()} vs {want:08x}")
            break
    else:
        check("tb_crc32c_matches_tensorboard", True)
    return _checks.status()


if __name__ == "__main__":
    sys.exit(main())
