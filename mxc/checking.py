"""The file-system edge of ``mxc check``: find specs, read them (YAML, or CUE through mxc.cue),
find their lockfiles, run the pure checker and, with --probe, the real parsers.

A .cue spec is unified with the nearest ``schema.cue`` in its directory or a parent (or a
parent's ``specs/``) inside its repository, else with the schema generated from this mxc's own
spec model. Every file is read through mxc/specfiles.py (inside the spec's repository, regular,
bounded).

Which files are specs: every *.yaml, *.yml and *.cue under a directory argument, except
``schema.cue``, sweep files (``matrix: mxc/v1``, checked against their ``spec:``) and partial
specs: a file another spec of the same run ``extends`` is checked through that spec (its
findings name its own lines) and listed as a note, because alone it lacks required keys.
"""

from __future__ import annotations

import os
import posixpath
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mxc.build import find_lock
from mxc.compiler.check import accepted
from mxc.compiler.check.findings import Finding, merge_matrix
from mxc.compiler.check.matrix import Matrix, is_matrix, parse_matrix
from mxc.compiler.check.report import Report, Target
from mxc.compiler.check.runner import Checked, check_document, check_matrix
from mxc.compiler.errors import SpecError, SpecErrors
from mxc.compiler.loader import Loaded, load_json
from mxc.compiler.resolve import ReadRefused, load_file, resolve
from mxc.errors import UserError
from mxc.specfiles import SpecFiles, read_spec, repository_of

SPEC_SUFFIXES = (".yaml", ".yml", ".cue")
SKIP_DIRS = {"node_modules", ".git", "__pycache__", ".venv"}


@dataclass
class Options:
    paths: list[str]
    matrix: str | None = None
    overrides: tuple[str, ...] = ()
    probe: bool = False
    probe_python: str | None = None
    probe_workers: int | None = None


@dataclass
class Run:
    report: Report
    checked: list[tuple[Target, list[Checked]]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def discover(paths: Iterable[str]) -> list[str]:
    """Spec-like files under ``paths`` (a file argument is taken as given), sorted, unique."""
    out: list[str] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.is_file() and f.suffix in SPEC_SUFFIXES and f.name != "schema.cue" \
                        and not SKIP_DIRS.intersection(f.relative_to(p).parts):
                    out.append(posixpath.normpath(str(f)))
        elif p.is_file():
            out.append(posixpath.normpath(str(p)))
        else:
            raise UserError(f"{raw}: no such file or directory", "give spec files or directories of specs")
    return list(dict.fromkeys(out))


def _load(path: str) -> Loaded:
    return load_file(path, SpecFiles.for_spec(path))


def _extends(path: str, doc: Loaded) -> list[str]:
    raw = doc.data.get("extends")
    parents = [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else []
    return [posixpath.normpath(posixpath.join(posixpath.dirname(path), p)) for p in parents
            if isinstance(p, str) and not p.startswith("base:")]  # a shared base is not a file of this check


def _schema_target(path: str, exc: SpecErrors) -> Target:
    return Target(path, findings=[Finding(e.file, e.line, e.key, "schema", "error", e.message, e.suggestion)
                                  for e in exc.errors])


def _cue_docs(paths: list[str], report: Report) -> dict[str, Loaded | Target]:
    """Export every .cue spec through one CUE process; a failure becomes a target with cue findings."""
    from mxc import cue

    out: dict[str, Loaded | Target] = {}
    texts: dict[str, str] = {}
    for p in paths:  # CUE reads them itself: the same confinement, file type and size rules first
        try:
            texts[p] = read_spec(p).decode("utf-8", errors="replace")
        except (ReadRefused, OSError) as exc:
            message = exc.message if isinstance(exc, ReadRefused) else f"cannot read: {exc.strerror or exc}"
            out[p] = Target(p, extra_checks=("cue", "schema"),
                            findings=[Finding(p, None, "", "cue", "error", message)])
    paths = [p for p in paths if p in texts]
    if not paths:
        return out
    if cue.cue_engine() is None:
        for p in paths:
            out[p] = Target(p, skipped=f"CUE spec not checked: {cue.missing_reason()}")
        return out
    with tempfile.TemporaryDirectory(prefix="mxc-cue-") as tmp:
        schema = _schema_cue(paths[0])
        if schema is None:  # no site schema.cue: the one generated from this mxc's own schema
            from mxc.compiler.check.cue_schema import job_spec_cue

            schema = Path(tmp) / "schema.cue"
            schema.write_text(job_spec_cue(), encoding="utf-8")
        try:
            results = cue.export_specs(schema, [Path(p) for p in paths])
        except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as exc:
            raise UserError(f"CUE could not run: {exc}", "check node and tools/cue (npm ci --prefix tools/cue)") from None
    for result in results:
        file = posixpath.normpath(result.file)
        if result.json_text is None:
            out[file] = Target(file, extra_checks=("cue", "schema"), findings=[
                Finding(file, e.line, ".".join(e.path), "cue", "error", f"CUE: {e.message}") for e in result.errors])
            continue
        try:
            doc = load_json(file, result.json_text)
        except SpecErrors as exc:
            out[file] = _schema_target(file, exc)
            continue
        text = texts.get(file, "")
        doc.lines[()] = (file, 1)
        _cue_lines(doc.data, (), text, file, doc.lines, cue.cue_line)
        out[file] = doc
    return out


def load_cue(path: str) -> Loaded:
    """One .cue spec as a document to compile (``mxc build x.cue``): the same export, schema and
    line mapping as ``mxc check``; CUE's complaints are SpecErrors, a missing CUE is one line."""
    path = posixpath.normpath(path)
    if not os.path.lexists(path):
        raise SpecErrors.one(path, None, "", "file not found")
    got = _cue_docs([path], Report())[path]
    if isinstance(got, Loaded):
        return got
    if got.skipped:
        from mxc import cue

        raise UserError(f"{path}: cannot compile a CUE spec: {cue.missing_reason()}", "or write the spec in YAML")
    raise SpecErrors(SpecError(f.file, f.line, f.key, f.message, f.suggestion or "") for f in got.findings)


def _cue_lines(node: Any, path: tuple[str | int, ...], text: str, file: str,
               lines: dict[tuple[str | int, ...], tuple[str, int]], finder: Any) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            sub = (*path, key)
            line = finder(text, sub)
            if line:
                lines[sub] = (file, line)
            _cue_lines(value, sub, text, file, lines, finder)


def _schema_cue(spec: str) -> Path | None:
    root = repository_of(spec)  # not a schema.cue someone left in a parent outside it (/tmp)
    for parent in Path(spec).resolve().parents:
        if not parent.is_relative_to(root):
            break
        candidate = parent / "schema.cue"
        if candidate.is_file():
            return candidate
        if (parent / "specs" / "schema.cue").is_file():
            return parent / "specs" / "schema.cue"
    return None


def _matrix(path: str) -> Matrix:
    if not os.path.lexists(path):
        raise UserError(f"--matrix {path}: no such file")
    doc = _load(path)
    if not is_matrix(doc):
        raise UserError(f"{path}: not a matrix file", "a sweep file starts with 'matrix: mxc/v1' (docs/check.md)")
    return parse_matrix(doc, path)


CONFIG_FILE_KEY = "maxtext-config-file-key"


def config_file_findings(doc: Loaded, path: str, checked: Checked) -> list[Finding]:
    """model.config_file read as `mxc build` reads it (confined, a YAML mapping, the same model; what would
    stop the build is a schema error here too), and each of its keys judged by the spec's MaxText key
    catalog, as model.overrides are: a warning, since what a MaxText does with a key it does not know in
    its config file depends on its version."""
    spec = checked.spec
    if spec is None or not spec.model.config_file:
        return []
    from mxc.compiler.config_file import read_config
    from mxc.compiler.errors import did_you_mean

    try:
        config = read_config(doc, path, spec.model.config_file, spec.model.model_name, SpecFiles.for_spec(path),
                             spec.checkpoint.period)
    except SpecErrors as exc:
        return [Finding(e.file, e.line, e.key, "schema", "error", e.message, e.suggestion, ()) for e in exc.errors]
    catalog = checked.subject.maxtext if checked.subject is not None else None
    if catalog is None:
        return []
    findings = []
    for key in config.keys:
        if key == "base_config" or key in catalog.keys:
            continue
        file, line = config.lines.get((key,), (path, 0))
        findings.append(Finding(file, line or None, key, CONFIG_FILE_KEY, "warning",
                                f"'{key}' is not a MaxText {catalog.version} config key",
                                did_you_mean(key, catalog.keys) or "code.maxtext_catalog names the MaxText that runs"))
    return findings


def _accepted(results: list[Checked]) -> list[Checked]:
    """The spec's check.accept applied to each result's complete findings (compiler/check/accepted.py)."""
    for result in results:
        if result.subject is not None and result.valid:
            result.findings = accepted.apply(result.subject, result.findings)
    return results


def _not_run(results: list[Checked]) -> dict[str, str]:
    """The rules that did not run on some combination of a sweep, with the first reason given."""
    out: dict[str, str] = {}
    for result in results:
        where = f"combination #{result.combination.number}: " if result.combination is not None else ""
        for rule, why in result.not_run.items():
            out.setdefault(rule, where + why)
    return out


def check_paths(opts: Options) -> Run:
    started = time.monotonic()
    report = Report()
    run = Run(report)
    files = discover(opts.paths) if opts.paths else []
    # A spec named by a sweep file is read with the sweep's repository as the root, so that
    # 'spec: ../../elsewhere' cannot reach outside it either.
    readers: dict[str, SpecFiles] = {}
    cli_matrix = _matrix(opts.matrix) if opts.matrix else None
    if not files and cli_matrix is not None:
        if cli_matrix.spec is None:
            raise UserError(f"{opts.matrix}: no spec to sweep", "name one: mxc check SPEC --matrix FILE, or 'spec:' in it")
        files = [posixpath.normpath(posixpath.join(posixpath.dirname(opts.matrix or ""), cli_matrix.spec))]
        readers[files[0]] = SpecFiles.for_spec(opts.matrix or "")
    if not files:
        raise UserError("nothing to check", "mxc check specs/ or mxc check SPEC --matrix FILE")

    yaml_docs: dict[str, Loaded] = {}
    sweeps: list[tuple[str, Matrix]] = []
    pending: list[Target] = []
    for f in files:
        if f.endswith(".cue"):
            continue
        try:
            doc = _load(f)
        except SpecErrors as exc:
            pending.append(_schema_target(f, exc))
            continue
        if is_matrix(doc):
            try:
                m = parse_matrix(doc, f)
            except SpecErrors as exc:
                pending.append(_schema_target(f, exc))
                continue
            if m.spec is None:
                report.notes.append(f"{f}: a matrix without 'spec:'; use mxc check SPEC --matrix {f}")
            else:
                sweeps.append((posixpath.normpath(posixpath.join(posixpath.dirname(f), m.spec)), m))
            continue
        yaml_docs[f] = doc
    extended: dict[str, str] = {}
    for f, doc in yaml_docs.items():
        for parent in _extends(f, doc):
            extended.setdefault(parent, f)
    cue_docs = _cue_docs([f for f in files if f.endswith(".cue")], report)

    def check_one(f: str) -> tuple[Target, list[Checked]]:
        lock = find_lock(f)
        if f in cue_docs:
            got = cue_docs[f]
            if isinstance(got, Target):
                return got, []
            doc = got
        else:
            try:
                doc = resolve(f, readers.get(f) or SpecFiles.for_spec(f), opts.overrides)
            except SpecErrors as exc:
                return _schema_target(f, exc), []
        if cli_matrix is not None and f not in extended:
            results = _accepted(check_matrix(doc, f, cli_matrix, lock))
            target = Target(f, cli_matrix.file, len(results),
                            findings=merge_matrix((x for r in results for x in r.findings), len(results)),
                            not_run=_not_run(results))
            return target, results
        result = check_document(doc, f, lock)
        result.findings.extend(config_file_findings(doc, f, result))
        _accepted([result])
        extra = ("cue", "schema") if f in cue_docs else ("schema",)
        return Target(f, findings=result.findings, extra_checks=extra, not_run=result.not_run), [result]

    for f in files:
        if f in extended:
            report.notes.append(f"{f}: partial spec (extended by {extended[f]}); checked through it")
            continue
        if f in yaml_docs or f in cue_docs:
            target, results = check_one(f)
            report.targets.append(target)
            run.checked.append((target, results))
    for spec, m in sweeps:
        lock = find_lock(spec)
        try:
            doc = resolve(spec, SpecFiles.for_spec(m.file), opts.overrides)
        except SpecErrors as exc:
            report.targets.append(_schema_target(m.file, exc))
            continue
        results = _accepted(check_matrix(doc, spec, m, lock))
        target = Target(spec, m.file, len(results),
                        findings=merge_matrix((x for r in results for x in r.findings), len(results)),
                        not_run=_not_run(results))
        report.targets.append(target)
        run.checked.append((target, results))
    report.targets.extend(pending)
    run.seconds["static"] = time.monotonic() - started
    if opts.probe:
        _probe(run, opts)
    return run


def _probe(run: Run, opts: Options) -> None:
    from mxc.compiler.check import probe_plan
    from mxc.runtime.probe import run_probe

    started = time.monotonic()
    everything = [c for _, results in run.checked for c in results]
    plan = probe_plan.plan(everything)
    if not plan.tokens and not plan.cases:
        run.report.notes.append("--probe: nothing to probe (no spec validated)")
        return
    answer = run_probe(plan.request(), opts.probe_python, opts.probe_workers)
    by_result = {id(c): t for t, results in run.checked for c in results}
    for finding, checked in _pair(plan, answer):
        by_result[id(checked)].findings.append(finding)
    for target, results in run.checked:
        target.extra_checks = (*target.extra_checks, "probe-xla", "probe-maxtext")
        pins = {r.subject.jaxlib.requested for r in results if r.subject and r.subject.jaxlib.requested}
        for pin in sorted(pins - {answer.get("jaxlib")}):
            target.findings.append(Finding(target.file, None, "code", "probe-xla", "note",
                                           f"probed with jaxlib {answer.get('jaxlib')}, but the spec pins {pin}",
                                           "--probe-python PATH: an interpreter with that jaxlib"))
    if answer.get("maxtext_error"):
        run.report.notes.append(f"--probe: MaxText not probed: {answer['maxtext_error']}")
    run.report.probe = {
        "jaxlib": answer.get("jaxlib"), "maxtext_version": answer.get("maxtext_version"),
        "tokens": len(plan.tokens), "maxtext_sets": len(plan.cases),
        "rejected_tokens": sorted(answer.get("bad_tokens", {})),
        "wall_seconds": answer.get("wall_seconds"), "worker_seconds": answer.get("seconds"),
    }
    run.seconds["probe"] = time.monotonic() - started


def _pair(plan: Any, answer: dict[str, Any]) -> list[tuple[Finding, Checked]]:
    """Findings of the probe, each with the checked spec/combination it belongs to."""
    from mxc.compiler.check import probe_plan

    out = []
    for checked, uses, cid in plan.uses:
        sub = probe_plan.Plan(uses=[(checked, uses, cid)])
        out += [(f, checked) for f in probe_plan.findings(sub, answer)]
    return out
