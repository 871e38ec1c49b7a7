#!/usr/bin/env python3
"""Lists every CUDA runtime, cuBLAS, cuDNN and NCCL call and every kernel launch (RG_LAUNCH) in
engine/, comm/ and kernels/cuda/, and whether the emulated build runs it, from the gcov data of
scripts/coverage.sh (gcovr's JSON). Writes docs/cuda-call-sites.md (scripts/coverage.sh calls it).
Sites are named by file, enclosing function and call, not by line, so edits elsewhere in a file
leave the document true. --check compares the sites with that file (CI runs it: the test
docs.cuda_call_sites); --refresh rewrites it from the code without coverage data, keeping the
verdicts of the sites it lists and marking new ones unmeasured until scripts/coverage.sh runs.

Usage: scripts/cuda-call-sites.py --coverage build/coverage/coverage/coverage.json [--out FILE]
       scripts/cuda-call-sites.py --check [FILE]
       scripts/cuda-call-sites.py --refresh [FILE]
"""
import argparse
import collections
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "cuda-call-sites.md"
SCANNED = [("engine", ("*.cpp", "*.h")), ("comm", ("*.cpp", "*.h")),
           ("kernels/cuda", ("*.cu", "*.cuh", "*.h", "*.cpp"))]
CALL = re.compile(r"\b((?:cuda|cublas|cudnn|nccl)[A-Z][A-Za-z0-9_]*)\s*\(")
# A create or destroy function passed by name (cudnn::Descriptor's template arguments): called
# where the wrapper is constructed and destroyed.
REFERENCE = re.compile(r"\b((?:cuda|cublas|cudnn|nccl)(?:Create|Destroy)[A-Za-z0-9]*)\b(?!\s*\()")
LAUNCH = re.compile(r"\bRG_LAUNCH\s*\(")
API = {"cuda": "cudart", "cubl": "cuBLAS", "cudn": "cuDNN", "nccl": "NCCL"}
# Files that define the library functions rather than call them: the run-time loading stubs.
DEFINITIONS = {"kernels/cuda/dynload.cpp", "kernels/cuda/dynload_symbols.h"}

# Files the emulated configuration does not compile, and why.
NOT_EMULATED = {
    "kernels/cuda/device.cu": "not built for the emulator (device_stub.cpp stands in): it asks the "
                              "real driver for devices, versions and a self-test",
    "engine/cuda/backend_none.cpp": "the backend of builds without CUDA",
    "comm/process_group_nccl_stub.cpp": "the NCCL group of builds without CUDA",
}
# Sites the emulated build compiles but no test reaches, keyed by (file, call): why.
NOT_REACHED = {
    ("engine/cuda/backend_cudart.cpp", "cudaGetLastError@check_release"):
        "clears cudaErrorCudartUnloading, which only a real runtime returns (frees during process "
        "exit, after it has unloaded); the emulator never unloads",
    ("kernels/cuda/conv2d.cu", "cudaMemsetAsync@conv2d_backward_data"):
        "zeroes the input gradient of a convolution with no filters or an empty output but a "
        "non-empty input; the device tests' empty case is an empty batch (nothing to zero)",
    ("kernels/cuda/conv2d_graph.cu", "cudaGetLastError@Scratch"):
        "clears a failed cudaMalloc of --cudnn-benchmark's timing scratch (out of device memory); "
        "the emulated device's memory is the host's",
    ("kernels/cuda/conv2d_graph.cu", "cudaEventDestroy@time_plan"):
        "frees the timing events when an engine fails while it is timed; the emulated cuDNN's "
        "engines do not fail there",
    ("comm/process_group_nccl.cpp", "ncclGroupEnd@exchange"):
        "closes the thread's NCCL group when a send or receive in it throws; nothing in our "
        "ring's path makes either fail",
    ("comm/process_group_nccl.cpp", "ncclCommAbort@~ProcessGroupNCCL"):
        "the destructor's aborts: of a failed group the watchdog has not aborted yet (it does so "
        "within 20 ms, once no one issues, before the destructor stops it), and after a failed "
        "finalize (the emulated finalize does not fail)",
    ("comm/process_group_nccl.cpp", "ncclCommAbort@ProcessGroupNCCL"):
        "the constructor's abort when what follows the communicator's creation (a stream, the "
        "progress board, the watchdog thread) throws; none of them fails in the tests",
    ("comm/process_group_nccl.cpp", "cudaLaunchHostFunc@modelled_all_reduce"):
        "the modelled transfer's host function: modelled_all_reduce runs in OverlapCudaEmu.* and "
        "the overlap benchmarks, which scripts/coverage.sh does not run",
}


def strip_code(text):
    """Blanks comments and string/char literals, keeping line structure."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def regions(lines):
    """For each line: 'emu' or 'real' inside an #if on RG_CUDA_EMU, else None."""
    stack, result = [], []
    for line in lines:
        s = line.strip()
        m = re.match(r"#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)", s)
        if m:
            kind, cond = m.groups()
            if kind in ("if", "ifdef", "ifndef"):
                side = None
                if "RG_CUDA_EMU" in cond:
                    negated = kind == "ifndef" or re.search(r"!\s*(defined)?\s*\(?\s*RG_CUDA_EMU",
                                                            cond)
                    side = "real" if negated else "emu"
                stack.append(side)
            elif kind == "else" and stack:
                stack[-1] = {"emu": "real", "real": "emu"}.get(stack[-1])
            elif kind == "elif" and stack:
                stack[-1] = None
            elif kind == "endif" and stack:
                stack.pop()
        result.append("real" if "real" in stack else "emu" if "emu" in stack else None)
    return result


CONTROL = ("if", "else", "for", "while", "do", "switch", "case", "try", "catch", "return")


def continues(line):
    """A line that does not end a statement, so the next one belongs to the same statement."""
    s = line.strip()
    return bool(s) and not s.endswith((";", "{", "}")) and not s.startswith(("#", "//"))


def enclosing_function(lines, index):
    """The function a line is in: the nearest body before it opened by a statement that starts at
    indentation 0 or 2 and reads name(...) ... { (not a class, namespace or control statement)."""
    indent = lambda l: len(l) - len(l.lstrip())
    for i in range(index, -1, -1):
        if "{" not in lines[i]:
            continue
        j = i
        while j > 0 and continues(lines[j - 1]):
            j -= 1
        statement = " ".join(l.strip() for l in lines[j:i + 1])
        first = re.match(r"[}\s]*(\w*)", statement).group(1)
        if indent(lines[j]) > 2 or first in CONTROL or statement.endswith(";"):
            continue
        m = re.search(r"(~?\w+)\s*\([^;{]*\)[^;{]*\{", statement)
        if m:
            return m.group(1)
    return ""


def first_argument(rest):
    """The first macro argument in `rest` (after the opening parenthesis), outer parentheses
    dropped: RG_LAUNCH((kernel<A, B>), ...) names kernel<A, B>."""
    depth, end = 0, len(rest)
    for i, c in enumerate(rest):
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                end = i
                break
            depth -= 1
        elif c == "," and depth == 0:
            end = i
            break
    arg = rest[:end].strip()
    if arg.startswith("(") and arg.endswith(")"):
        arg = arg[1:-1].strip()
    return " ".join(arg.split())


def find_sites():
    sites = []
    for base, patterns in SCANNED:
        for pattern in patterns:
            for path in sorted((ROOT / base).rglob(pattern)):
                rel = path.relative_to(ROOT).as_posix()
                if rel in DEFINITIONS:
                    continue
                raw = path.read_text().split("\n")
                code = strip_code(path.read_text()).split("\n")
                region = regions(code)
                for i, line in enumerate(code):
                    in_macro = line.lstrip().startswith("#define") or (
                        i > 0 and code[i - 1].rstrip().endswith("\\"))
                    for m in CALL.finditer(line):
                        if m.group(1).endswith("_t"):  # a type in a cast or a signature
                            continue
                        name = m.group(1)
                        sites.append(dict(file=rel, line=i + 1, call=name, api=API[name[:4]],
                                          region=region[i], macro=in_macro, by_name=False,
                                          function=enclosing_function(raw, i)))
                    for m in REFERENCE.finditer(line):
                        name = m.group(1)
                        sites.append(dict(file=rel, line=i + 1, call=name, api=API[name[:4]],
                                          region=region[i], macro=in_macro, by_name=True,
                                          function=enclosing_function(raw, i)))
                    if not in_macro:
                        for m in LAUNCH.finditer(line):
                            # The macro's arguments may go on over the next lines.
                            kernel = first_argument(" ".join([line[m.end():]] + code[i + 1:i + 6]))
                            sites.append(dict(file=rel, line=i + 1, call=f"RG_LAUNCH({kernel})",
                                              api="launch", region=region[i], macro=False,
                                              by_name=False,
                                              function=enclosing_function(raw, i)))
    return sorted(sites, key=lambda s: (s["file"], s["line"], s["call"]))


def statement_lines(code, index):
    """Indices of the lines of the statement that contains line `index`."""
    start = index
    while start > 0:
        prev = code[start - 1].rstrip()
        if not prev or prev.endswith((";", "{", "}")) or prev.lstrip().startswith("#"):
            break
        start -= 1
    end = index
    while end + 1 < len(code) and not code[end].rstrip().endswith((";", "{", "}")):
        end += 1
    return range(start, end + 1)


def load_counts(path):
    files = json.load(open(path))["files"]
    counts = {}
    for f in files:
        counts[f["file"]] = {l["line_number"]: l["count"] for l in f["lines"]
                             if not l.get("gcovr/noncode")}
    return counts


def classify(site, counts, code_cache):
    if site["file"] in NOT_EMULATED:
        return "no", NOT_EMULATED[site["file"]]
    if site["region"] == "real":
        return "no", "real CUDA only: the emulated build compiles the RG_CUDA_EMU branch"
    if site["macro"]:
        return "no", "inside a macro definition (counted where the macro is used)"
    lines = counts.get(site["file"])
    if lines is None:
        return "no", "no gcov data for this file (not built into the measured programs)"
    if site["file"] not in code_cache:
        code_cache[site["file"]] = strip_code((ROOT / site["file"]).read_text()).split("\n")
    code = code_cache[site["file"]]
    hits = [lines[i + 1] for i in statement_lines(code, site["line"] - 1) if i + 1 in lines]
    if not hits and site["by_name"]:
        # Named in a wrapper's base class: it runs when the wrapper's constructor does, the first
        # code after the name.
        later = [n for n in sorted(lines) if n > site["line"]]
        hits = [lines[later[0]]] if later and later[0] - site["line"] <= 10 else []
    if not hits:
        return "no", "no gcov line data at this statement"
    if max(hits) > 0:
        return "yes", ""
    key = (site["file"], f"{site['call']}@{site['function']}")
    return "no", NOT_REACHED.get(key, "NOT RUN by the emulated tests (no reason recorded)")


UNMEASURED = "unmeasured"


def render(sites, verdicts):
    apis = ("cudart", "cuBLAS", "cuDNN", "NCCL", "launch")
    by_api = collections.OrderedDict((a, [0, 0, 0]) for a in apis)
    for s, (ran, _) in zip(sites, verdicts):
        by_api[s["api"]][0] += 1
        by_api[s["api"]][1] += ran == "yes"
        by_api[s["api"]][2] += ran == UNMEASURED
    out = [
        "# CUDA call sites and the emulator",
        "",
        "Generated by `scripts/cuda-call-sites.py` from the gcov data of `scripts/coverage.sh`,",
        "which rewrites this file; do not edit it by hand. Every CUDA runtime (`cuda*`), cuBLAS",
        "(`cublas*`), cuDNN (`cudnn*`) and NCCL (`nccl*`) call and every kernel launch",
        "(`RG_LAUNCH`) in `engine/`, `comm/` and `kernels/cuda/`, and whether the emulated build",
        "(`rg_engine_emu`, `rg_comm_emu`, `rg_kernels_cuda_emu`) runs it in the tests that",
        "`scripts/coverage.sh` runs: *yes* when gcov counted its statement; *unmeasured* for a",
        "site added since that last ran (`scripts/cuda-call-sites.py --refresh` lists it). Sites",
        "are in the order of the code; the CI test `docs.cuda_call_sites` checks that this list",
        "is the code's.",
        "",
        "| API | call sites | run under emulation | not run | unmeasured |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for api, (total, ran, unmeasured) in by_api.items():
        out.append(f"| {api} | {total} | {ran} | {total - ran - unmeasured} | {unmeasured} |")
    total, ran, unmeasured = (sum(v[i] for v in by_api.values()) for i in range(3))
    out += [f"| all | {total} | {ran} | {total - ran - unmeasured} | {unmeasured} |", "",
            "| file | function | call | API | runs under emulation | why not |",
            "| --- | --- | --- | --- | --- | --- |"]
    for s, (r, why) in zip(sites, verdicts):
        how = " (passed by name)" if s["by_name"] else ""
        function = f"`{s['function']}`" if s["function"] else "(file scope)"
        if "|" in s["call"] + why:
            sys.exit(f"cuda-call-sites: '|' in a call or reason breaks the table: {s['call']}: {why}")
        out.append(f"| {s['file']} | {function} | `{s['call']}`{how} | {s['api']} | {r} | {why} |")
    return "\n".join(out) + "\n"


ROW = re.compile(r"^\| ([^|`]+?) \| (?:`([^`]*)`|\(file scope\)) \| `([^`]+)`[^|]* \| [^|]+ \| "
                 r"([^|]+?) \| ([^|]*?) ?\|$", re.M)


def key(site):
    return (site["file"], site["function"], site["call"])


def listed(text):
    """The sites a document lists, in order: ((file, function, call), (verdict, why)); exits
    naming a row of the site table that does not parse (a hand edit), rather than losing it."""
    table = text.split("| --- | --- | --- | --- | --- | --- |", 1)
    rows = [l for l in table[1].split("\n") if l.startswith("|")] if len(table) == 2 else []
    out = []
    for row in rows:
        m = ROW.match(row)
        if m is None:
            sys.exit(f"cuda-call-sites: cannot read this row of the site table: {row}")
        out.append(((m.group(1), m.group(2) or "", m.group(3)), (m.group(4), m.group(5).strip())))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--coverage", help="gcovr JSON of scripts/coverage.sh")
    ap.add_argument("--out", default=str(DOC))
    ap.add_argument("--check", nargs="?", const=str(DOC), help="compare the call sites with FILE")
    ap.add_argument("--refresh", nargs="?", const=str(DOC),
                    help="rewrite FILE's list from the code, keeping the verdicts it has")
    args = ap.parse_args()
    sites = find_sites()
    if args.check:
        want = collections.Counter(key(s) for s in sites)
        have = collections.Counter(k for k, _ in listed(pathlib.Path(args.check).read_text()))
        if want == have:
            print(f"cuda-call-sites: {args.check} lists all {sum(want.values())} call sites")
            return 0
        for k in sorted((want - have).keys()):
            print(f"cuda-call-sites: missing from {args.check}: {k[0]}, in {k[1] or 'file scope'}: "
                  f"{k[2]}", file=sys.stderr)
        for k in sorted((have - want).keys()):
            print(f"cuda-call-sites: gone from the code: {k[0]}, in {k[1] or 'file scope'}: {k[2]}",
                  file=sys.stderr)
        print("cuda-call-sites: run scripts/cuda-call-sites.py --refresh to list them (and "
              "scripts/coverage.sh to measure them)", file=sys.stderr)
        return 1
    if args.refresh:
        # Each listed site's verdict, in order, for the sites of the same file, function and call.
        known = collections.defaultdict(list)
        for k, verdict in listed(pathlib.Path(args.refresh).read_text()):
            known[k].append(verdict)
        verdicts = []
        for s in sites:
            left = known.get(key(s))
            verdicts.append(left.pop(0) if left else
                            (UNMEASURED, "added since scripts/coverage.sh last ran"))
        pathlib.Path(args.refresh).write_text(render(sites, verdicts))
        fresh = sum(v[0] == UNMEASURED for v in verdicts)
        print(f"cuda-call-sites: {len(sites)} call sites written to {args.refresh}, {fresh} of "
              "them unmeasured")
        return 0
    if not args.coverage:
        ap.error("--coverage (the gcovr JSON of scripts/coverage.sh) or --check")
    counts = load_counts(args.coverage)
    cache = {}
    verdicts = [classify(s, counts, cache) for s in sites]
    pathlib.Path(args.out).write_text(render(sites, verdicts))
    not_run = sum(v[0] == "no" for v in verdicts)
    unexplained = [s for s, v in zip(sites, verdicts) if v[1].startswith("NOT RUN")]
    print(f"cuda-call-sites: {len(sites)} call sites, {len(sites) - not_run} run under emulation; "
          f"written to {args.out}")
    for s in unexplained:
        print(f"cuda-call-sites: {s['file']}:{s['line']} {s['call']} (in {s['function']}) is not "
              "run and has no recorded reason (add one to NOT_REACHED)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
