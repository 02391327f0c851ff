"""Where a spec comes from: a YAML, JSON or TOML file (by its suffix), an inline YAML/JSON mapping
(``'{gpus: [8, 16], model: llama3-8b}'``), a dict, or a SweepSpec as it is."""

from __future__ import annotations

from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.jsonfile import nesting_depth, parse_json, read_bytes
from planner.core.limits import MAX_JSON_DEPTH
from planner.sweeping.spec import DEFAULT_MAX_POINTS, SweepSpec

SUFFIXES = (".yaml", ".yml", ".json", ".toml")


def _yaml(text: str, origin: str):
    import yaml  # PyYAML, a dependency: safe_load builds plain dicts, lists and scalars only

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise PlanInputError(f"{origin}:{where} not valid YAML ({problem})") from None


def _toml(data: bytes, origin: str):
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise PlanInputError(f"{origin}: reading TOML needs Python 3.11 or the tomli "
                                 "package; or write the spec as YAML or JSON") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise PlanInputError(f"{origin}: not valid TOML ({e})") from None


def read_spec_file(path: str | Path):
    """The mapping a spec file holds (parsed by its suffix), or one PlanInputError line."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise PlanInputError(f"{path}: a sweep spec is a {', '.join(SUFFIXES)} file "
                             "(or an inline mapping '{gpus: [8, 16]}')")
    data = read_bytes(path, "sweep spec", "give a YAML, JSON or TOML file")
    if suffix == ".json":
        return parse_json(data, str(path))
    if suffix == ".toml":
        return _toml(data, str(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PlanInputError(f"{path}: not UTF-8 text") from None
    return _yaml(text, str(path))


def load_spec(source, max_points: int = DEFAULT_MAX_POINTS) -> SweepSpec:
    """A SweepSpec from a file path, inline text starting with ``{``, a dict, or a SweepSpec."""
    if isinstance(source, SweepSpec):
        return source
    if isinstance(source, dict):
        data = source
    elif isinstance(source, str) and source.lstrip().startswith("{"):
        data = _yaml(source, "inline spec")
    elif isinstance(source, (str, Path)):
        data = read_spec_file(source)
    else:
        raise PlanInputError(f"a sweep spec is a file, an inline mapping or a dict, got "
                             f"{type(source).__name__}")
    if nesting_depth(data) > MAX_JSON_DEPTH:
        raise PlanInputError(f"spec: nested more than {MAX_JSON_DEPTH} levels deep")
    return SweepSpec.from_dict(data, max_points)
