"""Task sources → normalised tasks (the task contract of docs/architecture.md).

Each source has a loader that reads the bundled file in data/sources/ (or a user's local file, or a hub dataset
through `datasets.load_dataset`) and a normaliser that maps its rows to tasks: a stable task_id, the exact prompt,
gold answer, grader kind, domain and a difficulty from a documented per-source rule (docs/tasks.md).
"""
from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from pipeline.core.errors import RouterLiteError
from pipeline.core.paths import data_dir
from pipeline.core.prompts import LETTERS, math_prompt, mcq_prompt, user_text
from pipeline.core.tables import Table

TASK_COLUMNS = [
    "task_id", "source", "prompt", "gold", "grader", "domain", "difficulty",
    "source_split", "question_id", "category", "choices", "user_text",
]
DOMAINS = ("math", "knowledge", "reasoning")  # the verifiable domains `balance: domain_difficulty` needs
OPEN_DOMAIN = "open"  # open-ended instructions, graded by a judge (`grader: judge`)
DIFFICULTIES = ("easy", "medium", "hard")


# --- readers: every read error names the file (and row where there is one) --------------------------------------

def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        raise RouterLiteError(f"source file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for i, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise RouterLiteError(f"{path}: line {i} is not valid JSON ({exc.msg})") from None
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise RouterLiteError(f"{path}: cannot be read ({exc})") from None
    return rows


def read_table(path: Path) -> list[dict]:
    """Parquet, JSONL (optionally .gz) or CSV with a header."""
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".json")):
        return read_jsonl(path)
    if not path.exists():
        raise RouterLiteError(f"source file not found: {path}")
    try:
        if name.endswith(".parquet"):
            return pd.read_parquet(path).to_dict("records")
        if name.endswith(".csv"):
            return pd.read_csv(path).to_dict("records")
    except Exception as exc:  # pyarrow/pandas raise many types for a corrupt file
        raise RouterLiteError(f"{path}: cannot be read as {path.suffix} ({exc})") from None
    raise RouterLiteError(f"{path}: unsupported file type (use .parquet, .jsonl, .jsonl.gz or .csv)")


def load_hub(hub_id: str, config: str | None = None, split: str = "test") -> list[dict]:
    """A hub dataset id (or a local dataset dir / data file, which `load_dataset` accepts alike)."""
    import datasets  # imported here: it is slow to import and only this path needs it

    try:
        p = Path(hub_id)
        if p.is_file():
            fmt = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}.get(p.suffix, "json")
            ds = datasets.load_dataset(fmt, data_files=str(p), split="train")
        else:
            ds = datasets.load_dataset(hub_id, config, split=split)
    except Exception as exc:
        raise RouterLiteError(f"hub dataset {hub_id!r} (config {config!r}, split {split!r}) "
                              f"cannot be loaded: {exc}") from None
    return ds.to_pandas().to_dict("records")


# --- row helpers ------------------------------------------------------------------------------------------------

def _need(row: dict, key: str, where: str) -> str:
    value = row.get(key)
    if value is None or (isinstance(value, float) and pd.isna(value)) or str(value).strip() == "":
        raise RouterLiteError(f"{where}: no {key!r} (a task needs its gold answer and text)")
    return str(value)


def _seq(row: dict, key: str, where: str) -> list:
    """A list field (answer options): present, a list (not a string or null), with no null entries."""
    value = row.get(key)
    if hasattr(value, "tolist"):  # numpy array from Parquet
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value:
        got = "missing" if key not in row else f"{type(value).__name__} {str(value)[:40]!r}"
        raise RouterLiteError(f"{where}: field {key!r} must be a non-empty list of options, got {got}")
    if any(v is None for v in value):
        raise RouterLiteError(f"{where}: field {key!r} has a null option")
    return list(value)


@dataclass(frozen=True)
class TaskRow:
    """One task of source `source` (its `index`-th row of split `split`), as a normaliser builds it; `row()` is the
    task row (TASK_COLUMNS) a source's normaliser returns a list of."""

    source: str
    split: str
    index: int
    prompt: str
    gold: str
    grader: str
    domain: str
    difficulty: str
    question_id: object
    category: str = ""
    choices: int = 0
    user_text: str = ""  # the question as a person types it (default: the prompt less a known template)

    def row(self) -> dict:
        return {
            "task_id": f"{self.source}/{self.split}/{self.index:06d}", "source": self.source, "prompt": self.prompt,
            "gold": self.gold, "grader": self.grader, "domain": self.domain, "difficulty": self.difficulty,
            "source_split": self.split, "question_id": str(self.question_id), "category": self.category,
            "choices": int(self.choices), "user_text": user_text(self.user_text or self.prompt),
        }


def _letter(gold: str, n_options: int, where: str) -> str:
    gold = gold.strip()
    if gold.isdigit():  # some copies store the answer index
        gold = LETTERS[int(gold)]
    gold = gold.upper()
    if len(gold) != 1 or gold not in LETTERS[:n_options]:
        raise RouterLiteError(f"{where}: gold {gold!r} is not one of the {n_options} option letters")
    return gold


class _TrackedRows:
    """The rows handed to a normaliser, remembering which one it is at (for an error naming the row)."""

    def __init__(self, rows: list):
        self.rows, self.at = rows, None

    def __iter__(self):
        for i, r in enumerate(self.rows):
            self.at = i
            yield r
        self.at = None  # consumed whole (a normaliser that lists the rows first): the row is not known

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):  # a normaliser may slice or index (the row is then not tracked)
        return self.rows[index]


def normalise_checked(normalise: Callable[[Iterable[dict], str], list[dict]], rows: Iterable, where: str) -> list[dict]:
    """`normalise(rows, where)` for rows from a file or hub a user may have got wrong: a row that is not an object,
    or a field of the wrong shape that the normaliser trips over, is one RouterLiteError naming file, row and field
    (never a raw KeyError / TypeError / AttributeError)."""
    rows = list(rows)
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise RouterLiteError(f"{where}: row {i} is not an object with named fields (got {type(r).__name__} "
                                  f"{str(r)[:40]!r})")
    tracked = _TrackedRows(rows)
    try:
        return normalise(tracked, where)
    except RouterLiteError:
        raise
    except KeyError as exc:
        what = f"no field {exc.args[0]!r}" if exc.args else "a missing field"
    except (TypeError, AttributeError, ValueError, IndexError) as exc:
        what = f"a field has the wrong type or value ({type(exc).__name__}: {exc})"
    row = f"row {tracked.at}" if tracked.at is not None else "a row"
    raise RouterLiteError(f"{where}: {row}: {what}")


# --- per-source normalisers (difficulty rules are documented in docs/tasks.md) ----------------------------------

def norm_math500(rows: Iterable[dict], where: str) -> list[dict]:
    out = []
    for i, r in enumerate(rows):
        w = f"{where}: row {i}"
        level = int(r.get("level") or 3)
        difficulty = "easy" if level <= 2 else "medium" if level == 3 else "hard"
        out.append(TaskRow("math500", "test", i, math_prompt(_need(r, "problem", w)), _need(r, "answer", w),
                         "math_expression", "math", difficulty, r.get("unique_id", i), str(r.get("subject", ""))).row())
    return out


def _gsm8k_gold(answer: str, where: str) -> tuple[str, int]:
    if "####" not in answer:
        raise RouterLiteError(f"{where}: answer has no '#### <number>' final line")
    body, final = answer.rsplit("####", 1)
    steps = len([ln for ln in body.strip().split("\n") if ln.strip()])
    return final.strip().replace(",", ""), steps


def norm_gsm8k(rows: Iterable[dict], where: str) -> list[dict]:
    out = []
    for i, r in enumerate(rows):
        w = f"{where}: row {i}"
        gold, steps = _gsm8k_gold(_need(r, "answer", w), w)
        difficulty = "easy" if steps <= 2 else "medium" if steps <= 4 else "hard"
        out.append(TaskRow("gsm8k", "test", i, math_prompt(_need(r, "question", w)), gold, "integer", "math",
                         difficulty, i).row())
    return out


def _aime(rows: list[dict], where: str, source: str, lo: int, hi: int) -> list[dict]:
    out = []
    for i, r in enumerate(rows[lo:hi]):
        w = f"{where}: row {lo + i}"
        out.append(TaskRow(source, "test", i, math_prompt(_need(r, "problem", w)), _need(r, "answer", w).strip(),
                         "integer", "math", "hard", r.get("unique_id", lo + i)).row())
    return out


def norm_aime2025_i(rows, where):
    return _aime(list(rows), where, "aime2025_i", 0, 15)


def norm_aime2025_ii(rows, where):
    return _aime(list(rows), where, "aime2025_ii", 15, 30)


def _arc_options(r: dict, where: str = "") -> list[str]:
    if "options" in r:  # bundled copy: [{label, text}]
        options = _seq(r, "options", where)
        if not all(isinstance(o, dict) and o.get("text") is not None for o in options):
            raise RouterLiteError(f"{where}: field 'options' must be a list of {{label, text}} objects")
        return [o["text"] for o in options]
    choices = r.get("choices")  # hub allenai/ai2_arc: {text: [...], label: [...]}
    if not isinstance(choices, dict):
        raise RouterLiteError(f"{where}: no 'options' list and no 'choices' object {{text: [...], label: [...]}}")
    return _seq(choices, "text", f"{where}: choices")


def norm_arc_challenge(rows: Iterable[dict], where: str) -> list[dict]:
    out = []
    for i, r in enumerate(rows):
        w = f"{where}: row {i}"
        options = _arc_options(r, w)
        gold = r.get("answer", r.get("answerKey"))
        if gold is not None and str(gold).isdigit():  # a few original labels are "1".."4"
            gold = LETTERS[int(gold) - 1]
        gold = _letter(_need({"answer": gold}, "answer", w), len(options), w)
        question = _need(r, "question", w)
        words = len(question.split()) + sum(len(str(o).split()) for o in options)
        # ARC-Challenge has no per-question level: terciles of stem+options length (32 / 49 words) stand in for it
        difficulty = "easy" if words < 32 else "medium" if words < 49 else "hard"
        out.append(TaskRow("arc_challenge", "test", i, mcq_prompt(question, options), gold, "mcq_letter",
                         "reasoning", difficulty, r.get("id", i), choices=len(options)).row())
    return out


def _mmlu_difficulty(subject: str) -> str:
    if subject.startswith(("elementary_", "high_school_")):
        return "easy"
    if (subject.startswith(("college_", "professional_"))
            or subject in {"abstract_algebra", "formal_logic", "econometrics"}):
        return "hard"
    return "medium"


def norm_mmlu(rows: Iterable[dict], where: str) -> list[dict]:
    out = []
    for i, r in enumerate(rows):
        w = f"{where}: row {i}"
        # bundled CSV columns / hub cais/mmlu
        options = [_need(r, k, w) for k in "ABCD"] if "A" in r else _seq(r, "choices", w)
        gold = _letter(_need(r, "answer", w), len(options), w)
        subject = str(r.get("subject", ""))
        out.append(TaskRow("mmlu", "test", i, mcq_prompt(_need(r, "question", w), [str(o) for o in options]), gold,
                         "mcq_letter", "knowledge", _mmlu_difficulty(subject), r.get("row", i), subject,
                         len(options)).row())
    return out


def norm_mmlu_pro(rows: Iterable[dict], where: str) -> list[dict]:
    out = []
    for i, r in enumerate(rows):
        w = f"{where}: row {i}"
        options = _seq(r, "options", w)
        gold = _letter(_need(r, "answer", w), len(options), w)
        # MMLU-Pro's added questions (STEM websites, TheoremQA, SciBench) are its hard part; ori_mmlu ones medium
        difficulty = "medium" if str(r.get("src", "")).startswith("ori_mmlu") else "hard"
        out.append(TaskRow("mmlu_pro", "test", i, mcq_prompt(_need(r, "question", w), options), gold, "mcq_letter",
                         "knowledge", difficulty, _need(r, "question_id", w), str(r.get("category", "")),
                         len(options)).row())
    return out


def norm_rlpr(rows: Iterable[dict], where: str) -> list[dict]:
    """RLPR (openbmb/RLPR-*): free-form reasoning answers, graded as expressions."""
    out = []
    for i, r in enumerate(rows):
        w = f"{where}: row {i}"
        prompt = r.get("question") or r.get("problem") or r.get("prompt")
        if isinstance(prompt, (list, tuple)) or hasattr(prompt, "tolist"):  # chat-format prompt: last user turn
            turns = [t for t in list(prompt) if isinstance(t, dict) and t.get("role") == "user"]
            prompt = turns[-1]["content"] if turns else None
        gold = r.get("answer")
        if gold is None and isinstance(r.get("reward_model"), dict):
            gold = r["reward_model"].get("ground_truth")
        prompt = _need({"prompt": prompt}, "prompt", w)
        gold = _need({"answer": gold}, "answer", w)
        out.append(TaskRow("rlpr", "test", i, math_prompt(prompt), gold, "math_expression", "reasoning", "hard",
                           i).row())
    return out


# --- ZeroEval (yuchenlin/ZeroEval): the exact zero-shot JSON-answer prompts its models were sent ----------------
# One bundled table holds the three tasks (data/build/build_zeroeval.py); each source keeps its own rows. The prompt
# is used verbatim (the replay pool is keyed by its hash), never re-formatted.

# MATH level-5 problems about geometric figures: an Asymptote drawing or a named figure in the text. A stated,
# result-blind rule (the records carry no MATH subject label); the `demo` profile keeps this category out of training.
_FIGURE_RE = re.compile(r"\[asy\]|\b(?:triangles?|circles?|semicircles?|polygons?|pentagons?|hexagons?|octagons?|"
                        r"radius|radii|diameter|angles?|perimeter|trapezoids?|rectangles?|rhombus|parallelograms?|"
                        r"cylinders?|cones?|spheres?|prisms?|pyramids?)\b", re.I)
_CRUX_CODE_RE = re.compile(r"\[PYTHON\]\n(.*?)\nassert ", re.S)


def _zeroeval(rows: Iterable[dict], where: str, task: str) -> list[tuple[int, dict, str]]:
    picked = [r for r in rows if r.get("task") == task]
    if not picked:
        raise RouterLiteError(f"{where}: no rows with task {task!r} (expected the ZeroEval task table)")
    return [(int(r.get("index", i)), r, f"{where}: {r.get('qid', f'{task} row {i}')}") for i, r in enumerate(picked)]


def norm_zeroeval_gsm8k(rows: Iterable[dict], where: str) -> list[dict]:
    out = []
    for i, r, w in _zeroeval(rows, where, "gsm"):
        gold = _need(r, "gold", w).lstrip("#").strip().replace(",", "")  # upstream stores "# 1,600"
        steps = r.get("solution_steps")
        if steps is None or pd.isna(steps):
            raise RouterLiteError(f"{w}: no solution_steps (the GSM8K reference-solution length sets difficulty)")
        steps = int(steps)  # the rule of the `gsm8k` source: reference-solution steps
        difficulty = "easy" if steps <= 2 else "medium" if steps <= 4 else "hard"
        out.append(TaskRow("zeroeval_gsm8k", "test", i, _need(r, "prompt", w), gold, "integer", "math", difficulty,
                         r["qid"], "word_problem", user_text=_need(r, "question", w)).row())
    return out


def norm_zeroeval_math_l5(rows: Iterable[dict], where: str) -> list[dict]:
    out = []
    for i, r, w in _zeroeval(rows, where, "math-l5"):
        category = "geometry" if _FIGURE_RE.search(_need(r, "question", w)) else "other"
        out.append(TaskRow("zeroeval_math_l5", "test", i, _need(r, "prompt", w), _need(r, "gold", w).strip(),
                         "math_expression", "math", "hard", r["qid"], category,  # MATH level 5 = hard
                           user_text=r["question"]).row())
    return out


def norm_zeroeval_crux(rows: Iterable[dict], where: str) -> list[dict]:
    out = []
    for i, r, w in _zeroeval(rows, where, "crux"):
        m = _CRUX_CODE_RE.search(_need(r, "question", w))
        if not m:
            raise RouterLiteError(f"{w}: no [PYTHON] function followed by an assertion in the question")
        lines = len([ln for ln in m.group(1).split("\n") if ln.strip()])
        # code length: the corpus terciles of function lines (def line included) are 5 and 6
        difficulty = "easy" if lines <= 4 else "medium" if lines <= 6 else "hard"
        out.append(TaskRow("zeroeval_crux", "test", i, _need(r, "prompt", w), _need(r, "gold", w).strip(),
                         "python_literal", "reasoning", difficulty, r["qid"], "code_output",
                           user_text=r["question"]).row())
    return out


# --- AlpacaEval (tatsu-lab/alpaca_eval): open-ended instructions, no gold answer: graded by a judge ------------------
ALPACA_REFERENCE = "gpt4_1106_preview"  # the model the recorded judgments compare every reply with


def norm_alpaca_eval(rows: Iterable[dict], where: str) -> list[dict]:
    """One task per instruction (the bundled file holds one row per instruction x model: the first is kept), the
    prompt the instruction verbatim (the user's text, no template: the replay is keyed by it), `grader: judge`,
    `gold` the reference model the recorded judgments compare with (the judge grader compares with the profile's
    `collection.judge.reference` agent), `category` AlpacaEval's instruction set (self-instruct, oasst, koala,
    helpful_base, vicuna). Difficulty has no upstream label: the instruction's length in words stands in for it
    (terciles of the 805: < 13 easy, < 25 medium, else hard), a result-blind rule."""
    out, seen = [], set()
    for i, r in enumerate(rows):
        w = f"{where}: row {i}"
        qid = int(_need(r, "instruction_id", w))
        if qid in seen:
            continue
        seen.add(qid)
        instruction = _need(r, "instruction", w)
        words = len(instruction.split())
        difficulty = "easy" if words < 13 else "medium" if words < 25 else "hard"
        out.append(TaskRow("alpaca_eval", "test", qid, instruction, ALPACA_REFERENCE, "judge", OPEN_DOMAIN,
                           difficulty, qid, str(r.get("dataset", ""))).row())
    return sorted(out, key=lambda t: t["task_id"])


@dataclass(frozen=True)
class SourceSpec:
    key: str
    domain: str
    normalise: Callable[[Iterable[dict], str], list[dict]]
    bundled: str | None  # path under data/sources, None when no public copy can be bundled
    hub_id: str | None = None  # the public hub dataset, for users with network access


SOURCES: Table[SourceSpec] = Table("source", {s.key: s for s in [
    SourceSpec("math500", "math", norm_math500, "math500/test.jsonl.gz", "HuggingFaceH4/MATH-500"),
    SourceSpec("gsm8k", "math", norm_gsm8k, "gsm8k/test.jsonl.gz", "openai/gsm8k"),
    SourceSpec("aime2025_i", "math", norm_aime2025_i, "aime2025/aime25.jsonl.gz"),
    SourceSpec("aime2025_ii", "math", norm_aime2025_ii, "aime2025/aime25.jsonl.gz"),
    SourceSpec("arc_challenge", "reasoning", norm_arc_challenge, "arc_challenge/test.jsonl.gz", "allenai/ai2_arc"),
    SourceSpec("mmlu", "knowledge", norm_mmlu, "mmlu/test.parquet", "cais/mmlu"),
    SourceSpec("mmlu_pro", "knowledge", norm_mmlu_pro, "mmlu_pro/test.parquet", "TIGER-Lab/MMLU-Pro"),
    SourceSpec("rlpr", "reasoning", norm_rlpr, None, "openbmb/RLPR-Evaluation"),
    SourceSpec("zeroeval_gsm8k", "math", norm_zeroeval_gsm8k, "zeroeval/tasks.parquet"),
    SourceSpec("zeroeval_math_l5", "math", norm_zeroeval_math_l5, "zeroeval/tasks.parquet"),
    SourceSpec("zeroeval_crux", "reasoning", norm_zeroeval_crux, "zeroeval/tasks.parquet"),
    SourceSpec("alpaca_eval", OPEN_DOMAIN, norm_alpaca_eval, "../alpaca_eval/records.parquet"),
]})


def register_source(spec: SourceSpec, replace: bool = False) -> SourceSpec:
    """Add a task source (profiles may then list it under `sources:`); a key already taken -> error unless
    `replace` (docs/architecture.md, "How to add a task source")."""
    if not isinstance(spec, SourceSpec) or not isinstance(spec.key, str) or not spec.key:
        raise RouterLiteError(f"register_source needs a SourceSpec with a key, got {spec!r}")
    return SOURCES.register(spec.key, spec, replace=replace)


def sources_restored() -> AbstractContextManager[Table[SourceSpec]]:
    """The source table as it was on entry, restored on exit (tests that register toy sources)."""
    return SOURCES.restored()


def load_source(key: str, path: str | None = None, hub_id: str | None = None, hub_config: str | None = None,
                hub_split: str = "test") -> pd.DataFrame:
    """Normalised tasks of one source, from (in order of precedence) a hub id, a local file, or the bundled copy."""
    spec = SOURCES.lookup(key)
    if hub_id:
        rows, where = load_hub(hub_id, hub_config, hub_split), f"hub dataset {hub_id}"
    elif path:
        rows, where = read_table(Path(path)), str(path)
    elif spec.bundled:
        file = data_dir() / "sources" / spec.bundled
        rows, where = read_table(file), str(file)
    else:
        raise RouterLiteError(
            f"source {key!r} has no bundled copy (no public copy could be redistributed): set "
            f"`sources.{key}.path` in your profile (config/profiles/*.yaml) to a local Parquet/JSONL file, "
            f"or `sources.{key}.hub_id` (e.g. {spec.hub_id}) where the hub is reachable")
    tasks = pd.DataFrame(normalise_checked(spec.normalise, rows, where), columns=TASK_COLUMNS)
    if tasks.empty:
        raise RouterLiteError(f"source {key!r} ({where}) produced no tasks")
    return tasks
