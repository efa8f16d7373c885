#!/usr/bin/env python3
"""CSV and TSV training data (as datasets' "csv" loader and LLaMA-Factory read them), against
Python's csv module: records written by csv.DictWriter (excel and excel-tab dialects: quotes,
doubled quotes, delimiters, line breaks and CRLF inside fields, Chinese text, spaces, empty
cells, a UTF-8 BOM) render the same prompts and answers (tests/c/tool_data_examples --prompts) as
the same records written as JSON; AdvertiseGen's content/summary columns and alpaca's
instruction/input/output columns are detected as in JSON; what Python's strict csv reader
refuses is refused at file:line:col (a row with more or fewer fields than the header, a quote left
open, text after a closing quote, a column named twice, an empty column name), and so is text that
is not UTF-8 (Excel's GBK) and a Parquet file, each with what to do. Prints PASS/FAIL/SKIP."""
import csv
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mpi_runs import report  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
TOOL = os.path.join(BUILD, "tests", "tool_data_examples")


def prompts(path, *extra):
    p = subprocess.run([TOOL, "--train_file", path, "--prompts"] + list(extra), capture_output=True, text=True, timeout=60)
    return (p.stdout if p.returncode == 0 else None), p.stderr


def tricky_text(rng):
    parts = ["春风", "明月", ",", '"', '""', "\n", "\r\n", " ", "\t", "a,b", 'say "hi"', "江南", "x", "", "；", "🙂",
             "\\u0000", "\\n", "{\"k\": [1]}"]  # JSON-looking text is plain text in CSV
    return "".join(rng.choice(parts) for _ in range(rng.randint(0, 8)))


def write_pair(d, name, recs, fields, dialect, bom=False):
    """The records as CSV/TSV (csv.DictWriter) and as a JSON list; returns both paths."""
    ext = "tsv" if dialect == "excel-tab" else "csv"
    path = os.path.join(d, "%s.%s" % (name, ext))
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=fields, dialect=dialect)
    w.writeheader()
    for r in recs:
        w.writerow(r)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(("\ufeff" if bom else "") + buf.getvalue())
    # the reference: what csv.DictReader reads back, as JSON (so the check is csv's reading)
    with open(path, encoding="utf-8-sig", newline="") as f:
        back = [dict(r) for r in csv.DictReader(f, dialect=dialect)]
    jpath = os.path.join(d, name + ".json")
    json.dump(back, open(jpath, "w"), ensure_ascii=False)
    return path, jpath, back


def main():
    if not os.path.exists(TOOL):
        print("SKIP data_csv: %s not built" % TOOL)
        return 0
    d = tempfile.mkdtemp(prefix="glmtrain-csv-")
    try:
        rng = random.Random(5)
        for dialect in ("excel", "excel-tab"):
            for bom in (False, True):
                recs = [{"instruction": tricky_text(rng) + "问", "input": tricky_text(rng), "output": tricky_text(rng) + "答"}
                        for _ in range(60)]
                name = "alpaca_%s_%d" % (dialect.replace("-", "_"), bom)
                path, jpath, back = write_pair(d, name, recs, ["instruction", "input", "output"], dialect, bom)
                a, ea = prompts(path)
                b, eb = prompts(jpath)
                report("csv_%s_same_as_json" % name, a is not None and a == b and len(a.splitlines()) == len(back),
                       (ea + eb)[-400:] if a is None or b is None else "%d vs %d lines" % (len(a.splitlines()), len(b.splitlines())))
        recs = [{"content": tricky_text(rng) + "类型#裤", "summary": tricky_text(rng) + "宽松"} for _ in range(20)]
        path, jpath, _ = write_pair(d, "advertisegen", recs, ["content", "summary"], "excel")
        a, ea = prompts(path)
        b, eb = prompts(jpath)
        report("csv_columns_schema_detected", a is not None and a == b, (ea + eb)[-400:])
        a, ea = prompts(path, "--prompt_column", "content", "--response_column", "summary")
        report("csv_named_columns", a is not None and a == b, ea[-400:])

        bad = [("extra_field", 'instruction,output\na,b\nc,d,e\n', "csv_extra_field.csv:3:1: the row has 3 fields where the header names 2"),
               ("missing_field", 'instruction,output\na,b\nc\n', ":3:1: the row has 1 fields where the header names 2"),
               ("open_quote", 'instruction,output\na,"b\nc,d\n', ":2:3: a quoted field is not closed"),
               ("after_quote", 'instruction,output\n"a"b,c\n', ":2:4: text after a closing quote"),
               ("duplicate_column", 'output,output\na,b\n', "names the column \"output\" twice"),
               ("empty_column_name", 'instruction,,output\na,b,c\n', "empty column name")]
        for name, text, want in bad:
            path = os.path.join(d, "csv_%s.csv" % name)
            open(path, "w", encoding="utf-8", newline="").write(text)
            out, err = prompts(path)
            report("csv_refuses_%s" % name, out is None and want in err, err[-300:])
        path = os.path.join(d, "csv_extra_skipped.csv")
        open(path, "w", encoding="utf-8", newline="").write('instruction,output\na,b\nc,d,e\nf,g\n')
        out, err = prompts(path, "--skip_bad_samples")
        report("csv_bad_row_skipped_with_flag", out is not None and len(out.splitlines()) == 2, err[-300:])
        path = os.path.join(d, "gbk.csv")
        open(path, "wb").write("instruction,output\n你好,世界\n".encode("gbk"))
        out, err = prompts(path)
        report("csv_gbk_refused_with_iconv_hint", out is None and "gbk.csv:2:1: not UTF-8 text" in err and "iconv -f GBK" in err,
               err[-300:])
        path = os.path.join(d, "data.parquet")
        open(path, "wb").write(b"PAR1" + b"\0" * 64 + b"PAR1")
        out, err = prompts(path)
        report("parquet_refused_with_conversion", out is None and "a Parquet file" in err and "read_parquet" in err, err[-300:])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
