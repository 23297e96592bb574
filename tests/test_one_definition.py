"""One definition for every shared fact (issue 42): a grep over the source that fails where a second one appears.

Each fact has one home module; a *definition* is a line matching one of the fact's patterns (the forms the
duplicates took before they were removed: a ratio of norms, a ``def row_key``, a field tuple, a ``git rev-parse``, a
bare band around 1). Any other file with such a line fails, unless it is listed under ``allowed`` with the reason.
The patterns are per line and so can miss a definition spread over lines; ``test_patterns_catch_the_old_forms``
checks that each one still catches the forms it was written for, and passes the forms that call the home.

Facts and homes:
    rel-L2                       zyfa/norms.py          (rel_l2 and its zero-reference rule)
    recipe-spec grammar          zyfa/recipe_spec.py    (split_spec, get_recipe, parse_recipes, split_spec_list)
    row identity                 accuracy/io/results_io.py (row_key and its field tuples)
    shared FP64-reference key    zyfa/emulator.py       (QUANT_FIELDS, quantization_key)
    git reader                   capture/version.py     (git_state, git_label)
    kernel-vs-emulation bands    accuracy/scoring/tolerances.py (Band and its entries)
    cuDNN FP8 graph              zyfa/peers/cudnn_fp8.py (built there once; the bench times what zyfa.peers prepare)
    peer names                   zyfa/peers/names.py    (PEER_NAMES, BENCH_PEERS, OLD_NAMES)
    UsageError                   accuracy/io/command.py
    sharded-run scaffold         accuracy/io/shard.py   (wants_sharding, print_dry_run, rank_device, announce, give_up,
                                                         sharding_summary)
    FP64-oracle chunk            accuracy/io/device.py  (ORACLE_CHUNK, query rows per block of the oracle)
    run segments                 accuracy/io/results_io.py (earlier_runs: run_provenances reads it, set_earlier_runs
                                                         writes it; a resumed run mints its own run_id)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("zyfa", "reference", "capture", "accuracy", "scripts", "examples", "tests")
THIS = Path(__file__).resolve()


@dataclass(frozen=True)
class Fact:
    name: str
    home: str
    patterns: tuple[str, ...]
    folders: tuple[str, ...] = SCANNED  # where a second definition is looked for
    allowed: dict[str, str] = field(default_factory=dict)  # file -> why its matching lines are not a definition


_PEER = r"(sdpa-bf16:\w+|cudnn-fp8|flashinfer-fa3|flash-attn-triton-amd|sdpa-fp32)"
FACTS = (
    Fact("rel-L2", "zyfa/norms.py", (
        r"norm\([^\n]*\)\s*(\*\*\s*2\s*)?/[^\n]*norm\(",  # ||a - b|| / ||b|| in any spelling of a norm
        r"vector_norm\([^\n]*\)\)?\s*/",  # a norm divided by one computed before
        r"^\s*def\s+_*rel_l2\w*\s*\(",  # a function of that name
        r"sqrt\([^\n]*\)\s*/\s*(math\.|np\.|torch\.)?sqrt\(",  # the same from sums of squares
    ), allowed={
        "tests/accuracy/test_accuracy_metrics.py": "an independent oracle that compute_metrics' rel_l2 is checked by",
        "tests/accuracy/test_metrics_float64_expectations.py": "the same: compute_metrics' expected values by hand",
        "tests/zyfa/test_norms.py": "the home's own test, against the formula",
    }),
    Fact("row identity", "accuracy/io/results_io.py", (
        r"^\s*def\s+_*row_key\s*\(",
        r"row\.get\(\"input\"\),\s*row\.get\(\"input_content_hash\"\)",  # a key spelled out field by field
        r"row\.get\(\"kind\"\),\s*row\.get\(\"model\"\)",
        r"(?<!\w)\(\s*\"impact_(window|layer)\",\s*\w+,\s*\w+,",  # an impact key built as a tuple
        r"return\s*\(\s*name,\s*None,",  # the cliff sweep's key built as a tuple
    )),
    Fact("shared FP64-reference key", "zyfa/emulator.py", (
        r"^\s*QUANT_\w*\s*=\s*\(\s*\"(q|k|v|qk)_",  # a tuple of the recipe's quantization fields
        r"getattr\(\w+,\s*\w+\)\s+for\s+\w+\s+in\s+\(\s*\"q_format\"",
    )),
    Fact("git reader", "capture/version.py", (
        r"[\"']rev-parse[\"']",
        r"[\"']describe[\"']\s*,",
        r"[\"']status[\"']\s*,\s*[\"']--porcelain",
    ), folders=("zyfa", "reference", "capture", "accuracy", "scripts", "examples"),  # tests run git to check it
        allowed={
        "scripts/mutation_test.py": "asks another question: whether the files copied into the mutation work tree "
                                    "differ from HEAD (git status limited to those paths), and runs without the "
                                    "packages on its path",
    }),
    Fact("cuDNN FP8 graph", "zyfa/peers/cudnn_fp8.py", (
        r"\.pygraph\(",  # a cuDNN frontend graph
        r"\.sdpa_fp8\(",  # its FP8 attention node
        r"^\s*class\s+Prepared\w*Cudnn|^\s*class\s+\w*CudnnFp8",
        r"^\s*def\s+(make_(sdpa|cudnn_fp8|flash_attn_amd|flashinfer_fa3)|cudnn_fp8_call)\s*\(",  # the bench's wrappers
    )),
    Fact("peer names", "zyfa/peers/names.py", (
        r"[\"']sdpa-(cudnn|flash)[\"']\s*:",  # the old-name map
        r"[\"']" + _PEER + r"[\"']\s*:\s*[\"'][^\"']*[A-Z]",  # a name -> label map
        r"(" + _PEER + r"[\"']\s*,\s*[\"']){3}" + _PEER,  # a list of four or more (a subset of two is a choice)
    ), folders=("zyfa", "reference", "capture", "accuracy", "scripts", "examples"), allowed={
        "zyfa/peers/registry.py": "gives each name of the table its recipe, checks and prepare, checked equal to it",
        "accuracy/report/front.py": "FRONT_REAL is the front page's choice of implementations (ours among them) to "
                                    "show, a selection, not the names' definition",
    }),
    Fact("recipe-spec grammar", "zyfa/recipe_spec.py", (
        r"^\s*def\s+_*(get_recipe|split_spec\w*|resolve_recipe|recipe_from_spec)\s*\(",
        r"\.partition\(\s*[\"']@[\"']\s*\)",  # NAME@PLATFORM split by hand
    ), allowed={
        "zyfa/kernels/kernel_plan.py": "recipe_from_spec is a one-line alias of get_recipe, kept as a name for scripts",
    }),
    Fact("UsageError", "accuracy/io/command.py", (
        r"^\s*class\s+UsageError\b",
    )),
    Fact("sharded-run scaffold", "accuracy/io/shard.py", (
        r"sharded_launch\(\)\s+or\b",  # the test for the sharded path
        r"torch\.device\(\s*[\"']cuda[\"']\s*,\s*torch\.cuda\.current_device\(\)\)",  # this rank's GPU
        r"print\(format_plan\(",  # the dry-run plan
        r"\.settle\(\)",  # meeting the ranks after a shared refusal
        r"rank \{\w+\} \{len\(\w+\)\} (rows|cells)",  # the ranks line
        r"[\"']world_size[\"']:\s*[\w.]+,\s*[\"']backend[\"']",  # the sharding provenance
    ), folders=("zyfa", "reference", "capture", "accuracy", "scripts", "examples")),
    Fact("run segments", "accuracy/io/results_io.py", (
        r"[\"']earlier_runs[\"']",  # the key spelled out (read: run_provenances; write: set_earlier_runs)
        r"[\"']resumed[\"']\s*:\s*\[",  # a command's own list of resumed runs
        r"provenance\.get\(\"run_id\"\)\s+or\b",  # a resumed run taking the earlier run's id
        r"run_id=first\w*\.get\(\"run_id\"\)",
        r"\[\"run_id\"\]\s*=\s*\w+\.provenance\b",
    ), folders=("zyfa", "reference", "capture", "accuracy", "scripts", "examples"),  # tests build such files
        allowed={
        "accuracy/io/schemas.py": "types the field in the provenance schema (PROVENANCE); reads no runs from it",
    }),
    Fact("FP64-oracle chunk", "accuracy/io/device.py", (
        r"^\s*_*ORACLE_CHUNK\w*\s*(:[^=]*)?=(?!=)",  # ORACLE_CHUNK = 1024, _ORACLE_CHUNK: int = 1024
    )),
    Fact("kernel-vs-emulation band", "accuracy/scoring/tolerances.py", (
        r"-\s*1\)\s*[<>]=?\s*0\.0[13]\b",  # abs(ratio - 1) <= 0.03
        r"-\s*1\)\s*[<>]=?\s*[A-Z0-9_]*TOL\b",  # abs(ratio - 1) > H200_TOL
        r"\b[A-Z_]*BAND\s*=\s*\(",  # a band tuple
        r"\(\s*0\.97\s*,\s*1\.03\s*\)|\(\s*0\.8\s*,\s*1\.25\s*\)|\(\s*0\.5\s*,\s*2\.0\s*\)",
        r"\b1\.03\s*\*",  # e_k <= 1.03 * e_e
        r"^\s*[A-Z0-9_]*(TOL|TOLERANCE)\s*=\s*\{?\s*(\"\w+\":\s*)?0\.0[13]\b",  # TOL = 0.03, H200_TOL = 0.01
    ), allowed={
        "tests/zyfa/test_emulator.py": "two emulations (the row sum taken on the matrix unit against the exact "
                                       "one), not a kernel against its emulation",
    }),
)


def _files(folders):
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.resolve() != THIS and ".mutation" not in path.parts:
                yield path


def _hits(fact: Fact) -> list[str]:
    pats = [re.compile(p) for p in fact.patterns]
    found = []
    for path in _files(fact.folders):
        rel = path.relative_to(ROOT).as_posix()
        if rel == fact.home or rel in fact.allowed:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if any(p.search(line) for p in pats):
                found.append(f"{rel}:{n}: {line.strip()}")
    return found


@pytest.mark.parametrize("fact", FACTS, ids=[f.name for f in FACTS])
def test_no_second_definition(fact):
    hits = _hits(fact)
    assert not hits, (f"{fact.name} is defined in {fact.home}; use it there instead of:\n" + "\n".join(hits))


@pytest.mark.parametrize("fact", FACTS, ids=[f.name for f in FACTS])
def test_home_and_allowed_files_exist(fact):
    assert (ROOT / fact.home).is_file(), fact.home
    for rel in fact.allowed:
        assert (ROOT / rel).is_file(), f"{fact.name}: allowed file {rel} is gone; remove it from the list"


# the forms each fact's duplicates took (from the tree before issue 42's step), and calls of the home
OLD_FORMS = {
    "rel-L2": [
        "    return float((a - b).norm() / b.norm().clamp(min=1e-30))",
        "    return float(torch.linalg.vector_norm(out.double() - ref.double())) / den if den > 0 else math.nan",
        "    return float((a - b).norm() / n) if float(n) > 0 else float((a - b).norm())",
        "    return float(np.linalg.norm(a - b) / np.linalg.norm(b))",
        "def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:",
        "    return [float(math.sqrt(a) / math.sqrt(c)) if c > 0 else math.nan for a, c in zip(d, r)]",
    ],
    "row identity": [
        "def _row_key(row: dict) -> tuple:",
        "    return (row.get(\"input\"), row.get(\"input_content_hash\"), row.get(\"recipe\"))",
        "    return (row.get(\"kind\"), row.get(\"model\"), row.get(\"recipe\"), row.get(\"window\"))",
        "    windows = [(\"impact_window\", m, r, w, None, args.tokens, args.text) for kind, m, w, r in cells]",
        "    return (name, None, subject.recipe_name, subject.name)",
    ],
    "shared FP64-reference key": [
        "QUANT_KEY = (\"qk_rotation\", \"rotation_seed\", \"k_smoothing\", \"q_format\", \"k_format\", \"v_format\",",
        "QUANT_FIELDS = (\"q_format\", \"k_format\", \"v_format\", \"q_scale\", \"k_scale\", \"v_scale\",",
        "        key = tuple(getattr(recipe, f) for f in (\"q_format\", \"k_format\"))",
    ],
    "git reader": [
        "        head = subprocess.run([\"git\", \"rev-parse\", \"HEAD\"], capture_output=True, text=True, cwd=cwd)",
        "    commit = git(\"rev-parse\", \"HEAD\")",
        "        dirty = subprocess.run([\"git\", \"status\", \"--porcelain\"], capture_output=True, text=True)",
        "    out = subprocess.run([\"git\", \"describe\", \"--always\", \"--dirty\"], capture_output=True)",
    ],
    "kernel-vs-emulation band": [
        "    assert abs(e_k / e_e - 1) <= 0.03, f\"kernel error {e_k:.5f} vs emulator {e_e:.5f}\"",
        "        if abs(e_k / e_e - 1) > H200_TOL:",
        "RATIO_BAND = (0.97, 1.03)",
        "SUSPECT_BAND = (0.5, 2.0)",
        "NO_CLAIM_BAND = (0.8, 1.25)",
        "            assert e_k <= 1.03 * e_e + 1e-3, what",
        "TOL = 0.03",
        "H200_TOL = 0.01",
        "ERR_RATIO_TOL = {\"fp32\": 0.01, \"hopper_fp8\": 0.01}",
    ],
}
OLD_FORMS.update({
    "cuDNN FP8 graph": [
        "        g = cudnn.pygraph(io_data_type=dt.FP8_E4M3, intermediate_data_type=dt.FLOAT)",
        "        O, stats, amax_s, amax_o = g.sdpa_fp8(",
        "def make_cudnn_fp8(q, k, v, causal, sm_scale):",
        "def cudnn_fp8_call(q, k, v, causal, sm_scale):",
        "def make_flashinfer_fa3(q, k, v, causal, sm_scale):",
    ],
    "peer names": [
        "OLD_PEER_NAMES = {\"sdpa-cudnn\": \"sdpa-bf16:cudnn\", \"sdpa-flash\": \"sdpa-bf16:flash\"}",
        "PEERS = (\"sdpa-bf16:cudnn\", \"sdpa-bf16:flash\", \"cudnn-fp8\", \"flash-attn-triton-amd\")",
        "PLANE_PEERS = {\"cudnn-fp8\": \"cuDNN FP8\", \"flashinfer-fa3\": \"FA3 FP8 (FlashInfer)\"}",
    ],
    "UsageError": ["class UsageError(ValueError):"],
    "FP64-oracle chunk": ["ORACLE_CHUNK = 1024", "_ORACLE_CHUNK: int = 1024"],
    "run segments": [
        "        prov = {**first_prov, \"resumed\": [*first_prov.get(\"resumed\", []), {",
        "    prov[\"run_id\"] = results.provenance.get(\"run_id\") or uuid.uuid4().hex[:12]",
        "        run_id = shared.provenance.get(\"run_id\") or dist.broadcast(uuid.uuid4().hex[:12])",
        "                            run_id=first_prov.get(\"run_id\"), implementations=impls)",
        "        prov[\"run_id\"] = results.provenance[\"run_id\"]",
        "    earlier = prov.get(\"earlier_runs\") or []",
    ],
    "recipe-spec grammar": [
        "def resolve_recipe(spec: str) -> Recipe:",
        "def recipe_from_spec(spec: str | Recipe) -> Recipe:",
        "    name, _, platform = spec.partition(\"@\")",
    ],
    "sharded-run scaffold": [
        "    if sharded_launch() or args.dry_run is not None or args.backend is not None:",
        "            device = torch.device(\"cuda\", torch.cuda.current_device())",
        "            print(format_plan([\" \".join(map(str, c)) for c in cells], costs, plan(costs, world), rate))",
        "                dist.settle()  # every rank has said it before any exits",
        "              + \", \".join(f\"rank {k} {len(s)} rows\" for k, s in enumerate(shares)))",
        "        return {**p, \"world_size\": dist.world, \"backend\": dist.backend, \"wall_time_s\": wall,",
    ],
})
NEW_FORMS = {
    "rel-L2": ["    err = rel_l2(out, ref[0])", "    rel = rel_l2_from_terms(got[0], got[1])",
               "    \"rel_l2\": rel_l2_from_terms(err_sq, ref_sq),"],
    "row identity": ["        kept[row_key(row, across_runs=True)] = row",
                     "    return row_key({\"input\": name, \"recipe\": subject.recipe_name})",
                     "    if impact_key(\"impact_window\", model_name, r, w, None, n_tokens, text) not in sink.done"],
    "shared FP64-reference key": ["        key = quantization_key(recipe)"],
    "git reader": ["    commit, dirty = git_state()", "        f.attrs[\"git_commit\"] = git_label()"],
    "kernel-vs-emulation band": ["    assert KERNEL_VS_EMULATION.contains(e_k / e_e)",
                                 "    assert e_k <= KERNEL_VS_EMULATION.high * e_e + 1e-3",
                                 "FA2_MODEL_RATIO_TOL = 5e-3",
                                 "        assert abs(rec[\"fa2_model_ratio\"] - ratio) <= FA2_MODEL_RATIO_TOL"],
    "cuDNN FP8 graph": ["    prepared = prepare_prepared_peer(peer, q, k, v, causal=causal, sm_scale=sm_scale)",
                        "    res = _run_prepared(cudnn_fp8.prepare, x, out_amax=amax)"],
    "peer names": ["    peers = [p for p in PEER_NAMES if any(p in (r.get(\"vs\") or {}) for r in mine)]",
                   "PLANE_PEERS = (\"cudnn-fp8\", \"flashinfer-fa3\")",
                   "    prepare(\"flashinfer-fa3\", q, k, v, causal=False, sm_scale=0.1)"],
    "recipe-spec grammar": ["    recipe = get_recipe(spec)", "    recipes = parse_recipes(args.recipes)",
                            "from zyfa.recipe_spec import SpecError, get_recipe"],
    "UsageError": ["from accuracy.io.command import UsageError", "        raise UsageError(str(e)) from None"],
    "FP64-oracle chunk": ["from zyfa.accuracy.io.device import ORACLE_CHUNK, check_memory",
                          "    chunk_size: int = ORACLE_CHUNK,",
                          "    ref_orig = attention_fp64(x.q, x.k, x.v, chunk_size=ORACLE_CHUNK, **kw)"],
    "run segments": ["    runs = {seg.get(\"run_id\") for _, p in provs for seg in run_provenances(p)} - {None}",
                     "        set_earlier_runs(provenance, self.earlier)",
                     "    prov[\"run_id\"] = uuid.uuid4().hex[:12]",
                     "        provenance[\"run_id\"] = self.run_id"],
    "sharded-run scaffold": ["        if wants_sharding(args, out):", "        device = rank_device(device, dist)",
                             "        give_up(dist, e)", "    announce(\"zyfa impact: \", dist, shares, \"cells\")",
                             "    results.start({\"command\": cmd, \"world_size\": dist.world, \"rank\": dist.rank})"],
}


@pytest.mark.parametrize("fact", FACTS, ids=[f.name for f in FACTS])
def test_patterns_catch_the_old_forms(fact):
    pats = [re.compile(p) for p in fact.patterns]
    missed = [line for line in OLD_FORMS[fact.name] if not any(p.search(line) for p in pats)]
    assert not missed, f"{fact.name}: the patterns no longer catch {missed}"
    wrong = [line for line in NEW_FORMS[fact.name] if any(p.search(line) for p in pats)]
    assert not wrong, f"{fact.name}: the patterns flag a use of the home: {wrong}"
