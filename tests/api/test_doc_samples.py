"""The code samples of README.md and docs/*.md, checked against the code they describe.

Fenced blocks are samples by their language: ```python runs, ```bash/```sh/```shell/```console
are commands (```text, ```yaml and unlabelled blocks are not code: synopses, output, configs).

- Python samples run, each in a fresh namespace, in a temporary folder holding the tiny test
  models under the file names the samples use (MODEL_FILES); a sample that talks to
  `localspec serve` at SERVER_URL gets a real server on the tiny models at a free port instead.
  They must run through: an exception or a failed assertion fails the test.
- Commands are split at `&&`, `||`, `;` and `|` (with `\\` continuations, comments, `$ `
  prompts, redirections and leading VAR=value assignments handled); every `localspec ...`
  must parse with the real argparse parser (placeholders such as TARGET.gguf are fine: parsing
  opens no file), `python`/`bash` scripts of this repository must exist, everything else must
  split as the shell would (balanced quotes).

Marker convention: an HTML comment `<!-- sample: KIND -->` on the line right before a fence.
KIND gpu (needs a CUDA/Metal build), hub (downloads from the Hugging Face Hub or a package
index), slow (a real model, training, or more than a minute): the sample is compiled, never
run. KIND `excerpt PATH`: the sample is a verbatim excerpt of PATH (a file of this repository),
checked as a substring of it instead of being run. Commands are only ever parsed, so they
need no marker.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import CodeType

import pytest

from helpers.server import running

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell", "console"}
COMPILE_ONLY = {"gpu", "hub", "slow"}
KINDS = COMPILE_ONLY | {"excerpt"}

# the model files Python samples name, and which tiny model (a key of the `models` fixture)
# stands for each of them in the sample's folder
MODEL_FILES = {
    "target.gguf": "target",
    "target.eagle3.gguf": "draft",
    "other.eagle3.gguf": "draft31",
}
# where samples expect `localspec serve`; replaced by a server on the tiny models
SERVER_URL = "http://127.0.0.1:8080"

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
MARKER = re.compile(r"^\s*<!--\s*sample:\s*(?P<kind>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Sample:
    file: str  # relative to the repository
    line: int  # the opening fence, 1-based
    lang: str
    code: str
    marker: str  # "" or the marker's text (e.g. "gpu", "excerpt localspec/speculation/step.py")

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def extract(text: str, file: str) -> list[Sample]:
    """Every fenced block of a Markdown text, with the marker right above it if any."""
    lines = text.split("\n")
    out: list[Sample] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence = m["fence"]
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        mark = MARKER.match(lines[i - 1]) if i > 0 else None
        body = textwrap.dedent("\n".join(lines[i + 1 : j]))
        lang = (m["info"].split() or [""])[0].lower()
        out.append(Sample(file, i + 1, lang, body, mark["kind"] if mark else ""))
        i = j + 1
    return out


def markers_out_of_place(text: str, file: str) -> list[str]:
    """Markers that do not sit right above a fence, or name no known kind."""
    lines = text.split("\n")
    bad = []
    for n, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        kind = m["kind"].split()
        if n + 1 >= len(lines) or not FENCE.match(lines[n + 1]):
            bad.append(f"{file}:{n + 1}: a sample marker must sit right above a fence")
        elif not kind or kind[0] not in KINDS or (kind[0] == "excerpt") != (len(kind) == 2):
            bad.append(f"{file}:{n + 1}: unknown marker {m['kind']!r} (kinds: {sorted(KINDS)})")
    return bad


def _all_samples() -> list[Sample]:
    out = []
    for path in DOCS:
        out += extract(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    return out


SAMPLES = _all_samples()
PY_SAMPLES = [s for s in SAMPLES if s.lang in PYTHON]
SH_SAMPLES = [s for s in SAMPLES if s.lang in SHELL]


# ---------------------------------------------------------------- commands


def logical_lines(sample: Sample) -> list[tuple[int, str]]:
    """The commands' lines of a block with `\\` continuations joined, each with its line in
    the file; in a console block only the lines after a `$ ` prompt (the rest is output)."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for n, raw in enumerate(sample.code.split("\n"), start=sample.line + 1):
        line = raw.rstrip()
        if not pending:
            if line.lstrip().startswith("$ "):
                line = line.lstrip()[2:]
            elif sample.lang == "console":
                continue
            start = n
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        out.append((start, " ".join([*pending, line])))
        pending = []
    if pending:
        out.append((start, " ".join(pending)))
    return out


OPERATORS = {"&&", "||", ";", "|", "&"}
REDIRECTS = {"<", ">", ">>", "&>", ">&"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def split_commands(line: str) -> list[list[str]]:
    """A shell line as the argument vectors of its simple commands (ValueError on unbalanced
    quotes): operators split it, redirections and leading assignments are dropped."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    commands: list[list[str]] = [[]]
    tokens = iter(list(lex))
    for tok in tokens:
        if tok in OPERATORS:
            commands.append([])
        elif tok in REDIRECTS:
            next(tokens, None)
        elif not commands[-1] and ASSIGNMENT.match(tok):
            continue
        else:
            commands[-1].append(tok)
    return [c for c in commands if c]


def parse_localspec(argv: list[str]) -> str | None:
    """None where the real parser takes `localspec ARGV`, else what it said."""
    from localspec.cli import build_parser

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            if exc.code not in (0, None):
                said = err.getvalue().strip().splitlines()
                return said[-1] if said else f"exit {exc.code}"  # the error, not the usage
    return None


def check_command(argv: list[str]) -> str | None:
    """None where a command of a sample is fine, else the problem."""
    if argv[0] == "localspec":
        return parse_localspec(argv[1:])
    if argv[0] in ("python", "python3", "bash") and len(argv) > 1:
        script = argv[1]
        if script.endswith((".py", ".sh")) and not (ROOT / script).is_file():
            return f"no such script in the repository: {script}"
    return None


def shell_problems(sample: Sample) -> list[str]:
    problems = []
    for line_no, line in logical_lines(sample):
        try:
            commands = split_commands(line)
        except ValueError as exc:
            problems.append(f"{sample.file}:{line_no}: {exc}: {line}")
            continue
        for argv in commands:
            problem = check_command(argv)
            if problem:
                problems.append(f"{sample.file}:{line_no}: {shlex.join(argv)}\n    {problem}")
    return problems


@pytest.mark.parametrize("sample", SH_SAMPLES, ids=[s.where for s in SH_SAMPLES])
def test_shell_sample(sample: Sample) -> None:
    problems = shell_problems(sample)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- Python


def compiled(sample: Sample, code: str | None = None) -> CodeType:
    """The sample compiled so that tracebacks name the Markdown file and its line numbers."""
    text = sample.code if code is None else code
    return compile("\n" * sample.line + text, sample.file, "exec")


@contextlib.contextmanager
def tiny_server(models: dict[str, str]) -> Iterator[str]:
    """`localspec serve` on the tiny pair, in a thread on a free loopback port (the server
    tests' own helper)."""
    import localspec

    opts = {"n_threads": 1, "n_ctx": 1024}
    with (
        localspec.load(models["target"], draft=models["draft"], **opts) as eng,
        running(eng) as url,
    ):
        yield url


def run_python(sample: Sample, models: dict[str, str], folder: Path) -> None:
    for name, key in MODEL_FILES.items():
        shutil.copyfile(models[key], folder / name)
    with contextlib.ExitStack() as stack:
        code = sample.code
        if SERVER_URL in code:
            code = code.replace(SERVER_URL, stack.enter_context(tiny_server(models)))
        exec(compiled(sample, code), {"__name__": "__doc_sample__"})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sample", PY_SAMPLES, ids=[s.where for s in PY_SAMPLES])
def test_python_sample(
    sample: Sample, models: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled(sample)  # a syntax error fails every sample, marked or not
    kind, *arg = sample.marker.split() or [""]
    if kind in COMPILE_ONLY:
        pytest.skip(f"compiled only, not run: <!-- sample: {kind} -->")
    if kind == "excerpt":
        source = (ROOT / arg[0]).read_text(encoding="utf-8")
        verbatim = sample.code.strip() in source
        assert verbatim, f"{sample.where} is no longer a verbatim excerpt of {arg[0]}"
        return
    monkeypatch.chdir(tmp_path)
    run_python(sample, models, tmp_path)


# ---------------------------------------------------------------- the extraction itself


def test_markers_sit_above_fences_and_name_known_kinds() -> None:
    bad = []
    for path in DOCS:
        bad += markers_out_of_place(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not bad, "\n".join(bad)


def test_samples_are_found() -> None:
    assert any(s.file == "README.md" and "localspec.load(" in s.code for s in PY_SAMPLES)
    assert any("localspec generate" in s.code for s in SH_SAMPLES)


BROKEN = """\
Some text.

```console
$ localspec generate TARGET.gguf --no-such-flag -p "x"
output, not a command: --neither-this
```

```bash
X=1 localspec bench t.gguf --k 1,2 \\
   --limit 3 && pip install "unbalanced
localspec info F.gguf --json   # fine
```

<!-- sample: gpu -->
```python
assert False  # compiled only
```

```python
import localspec

assert localspec.Stats().explanation() == "no such text"
```

<!-- sample: warp-drive -->
```text
not code
```
"""


def test_the_checks_can_fail(models: dict[str, str], tmp_path: Path) -> None:
    """Negative controls: a wrong flag, unbalanced quotes, a failing assertion, a bad marker."""
    samples = extract(BROKEN, "broken.md")
    assert [(s.line, s.lang, s.marker) for s in samples] == [
        (3, "console", ""),
        (8, "bash", ""),
        (15, "python", "gpu"),
        (19, "python", ""),
        (26, "text", "warp-drive"),
    ]
    problems = shell_problems(samples[0])
    assert len(problems) == 1 and "broken.md:4" in problems[0]
    assert "unrecognized arguments: --no-such-flag" in problems[0]
    problems = shell_problems(samples[1])
    assert len(problems) == 1 and "broken.md:9" in problems[0]  # the quotes, not the parser
    assert split_commands("X=1 localspec bench t.gguf --k 1,2 < p.txt && make lint # x") == [
        ["localspec", "bench", "t.gguf", "--k", "1,2"],
        ["make", "lint"],
    ]
    assert shell_problems(Sample("b.md", 1, "bash", "python scripts/no-such.py", ""))
    compiled(samples[2])
    with pytest.raises(AssertionError) as failed:
        run_python(samples[3], models, tmp_path)
    tb = failed.tb
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert (tb.tb_frame.f_code.co_filename, tb.tb_lineno) == ("broken.md", 22)  # its own line
    bad = markers_out_of_place(BROKEN, "broken.md")
    assert len(bad) == 1 and "broken.md:25" in bad[0] and "warp-drive" in bad[0]
