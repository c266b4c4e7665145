"""Reference pages written from the code itself, so the page and the help cannot disagree.

Directives (used in docs/reference/*.rst):

``.. xlanb-api:: NAME NAME ...``  autodoc entries for public names of ``xlanb``
``.. xlanb-api-rest::``           every name of ``xlanb.__all__`` no ``xlanb-api`` took
``.. xlanb-magics::``             every IPython magic of ``XlaMagics``, with what ``%name?`` says
``.. xlanb-pdb-commands::``       every command ``XlaPdb`` adds to pdb, with what ``help NAME`` says
``.. xlanb-settings::``           every ``XLANB_*`` variable and ``xlanb.config`` field, from
                                  ``xlanb/base/config.py`` (its docstring, the comments above
                                  each field, its checker and its default)

Object types ``magic``, ``pdbcommand`` and ``setting`` give each entry an anchor, an index
entry and a role (``:magic:`xla_mode```, ``:pdbcommand:`xpeek```, ``:setting:`XLANB_MODE```).
"""
from __future__ import annotations

import ast
import inspect
import io
import os
import re
import tokenize

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


def _parse(directive: SphinxDirective, lines: list[str]) -> list[nodes.Node]:
    """Generated reStructuredText, parsed where the directive stands."""
    node = nodes.section()
    node.document = directive.state.document
    source = directive.get_source_info()[0]
    content = StringList()
    for i, line in enumerate(lines):
        content.append(line, source, i)
    nested_parse_with_titles(directive.state, content, node)
    return node.children


def _literal(text: str, indent: str = "   ") -> list[str]:
    """``text`` as a literal block, under ``indent``."""
    out = [f"{indent}.. code-block:: text", ""]
    out += [f"{indent}   {line}" if line.strip() else "" for line in text.splitlines()]
    return out + [""]


# ------------------------------------------------------------------------------- API

# Sphinx's roles (:class:`X`), which plain docutils does not know, as literals: enough to
# tell whether the rest of a docstring is reStructuredText.
_ROLE = re.compile(r":[\w:]+:`([^`]*)`")


def is_clean_rst(text: str) -> bool:
    """Does ``text`` parse as reStructuredText without a warning?"""
    from docutils.core import publish_doctree
    stream = io.StringIO()
    publish_doctree(_ROLE.sub(r"``\1``", text), settings_overrides={
        "report_level": 2, "halt_level": 5, "warning_stream": stream,
        "file_insertion_enabled": False, "raw_enabled": False})
    return not stream.getvalue()


def docstring_as_written(app, what, name, obj, options, lines) -> None:
    """xlanb's docstrings are written for ``help()``; one that is not valid
    reStructuredText (an indented example, a bullet without its blank line) is shown as
    written, in a literal block, instead of failing the build."""
    if lines and not is_clean_rst("\n".join(lines)):
        lines[:] = ["::", ""] + [f"   {line}" if line.strip() else "" for line in lines] + [""]


def _kind(obj) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "class"
    if inspect.isroutine(obj):
        return "function"
    return "data"


def _module(name: str):
    """``xlanb.spmd``, or ``xlanb.metrics``: an attribute of xlanb (its home is
    ``xlanb.base.metrics``), which is how users reach it."""
    import importlib
    try:
        return importlib.import_module(name)
    except ImportError:
        parent, _, attr = name.rpartition(".")
        return getattr(_module(parent), attr)


def api_lines(module: str, names: list[str]) -> list[str]:
    """autodoc directives for ``module.NAME``, each by what the object is."""
    mod = _module(module)
    out = []
    import xlanb
    for name in names:
        obj = getattr(mod, name)
        full = f"{module}.{name}"
        kind = _kind(obj)
        if module != "xlanb" and getattr(xlanb, name, None) is obj and name in xlanb.__all__:
            # re-exported from xlanb's own API (the widgets' SummaryDiff): one entry, there
            role = "class" if kind == "class" else "func" if kind == "function" else "data"
            out += [f"``{full}`` is :py:{role}:`xlanb.{name}`.", ""]
        elif kind == "module":
            # a module of the API (xlanb.spmd, ...) has a section of its own (automodule)
            out += [f"``{full}``: the module :mod:`{obj.__name__}`.", ""]
        elif kind == "class":
            out += [f".. autoclass:: {full}", "   :members:", "   :show-inheritance:", ""]
        elif kind == "function":
            out += [f".. autofunction:: {full}", ""]
        elif type(obj).__module__.startswith("xlanb"):  # an instance (xlanb.config)
            out += [f".. py:data:: {name}", f"   :module: {module}", "",
                    f"   An instance of :class:`{type(obj).__module__}.{type(obj).__qualname__}`.",
                    ""]
        else:
            out += _data_lines(module, obj, name)
    return out


def _defined_with(name: str) -> str:
    """The comment above ``NAME = ...`` at the top level of the xlanb module that
    assigns it ("" if none): a constant's only documentation."""
    import xlanb
    root = os.path.dirname(xlanb.__file__)
    for folder, _, files in os.walk(root):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            source = open(os.path.join(folder, f), encoding="utf-8").read()
            if not re.search(rf"^{re.escape(name)}\s*=", source, re.M):
                continue
            for stmt in ast.parse(source).body:
                if isinstance(stmt, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
                    return _comment_above(_comments(source), stmt.lineno)
    return ""


def _data_lines(module: str, obj, name: str) -> list[str]:
    """A constant: its value (a dict by its keys and the type of its values) and the
    comment above its definition. autodoc would show the docstring of its type."""
    out = [f".. py:data:: {name}", f"   :module: {module}"]
    if isinstance(obj, dict):
        kinds = {type(v) for v in obj.values()}
        of = f" of :class:`{kinds.pop().__name__}`" if len(kinds) == 1 else ""
        keys = (", ".join(f"``{k}``" for k in obj) if len(obj) <= 12
                else f"{len(obj)} names (``{next(iter(obj))}``, ...)")
        out += ["   :type: dict", "", f"   A dict{of}, keyed by {keys}."]
    else:
        out += [f"   :value: {obj!r}", ""]
    comment = _defined_with(name)
    if comment:
        out += ["", f"   {_rst_text(comment)}"]
    return out + [""]


class ApiDirective(SphinxDirective):
    """Autodoc entries for the names given (of ``xlanb`` unless ``:module:`` says)."""
    has_content = True
    option_spec = {"module": directives.unchanged, "all": directives.flag}

    def run(self):
        module = self.options.get("module", "xlanb")
        names = " ".join(self.content).split()
        if "all" in self.options:
            names = list(_module(module).__all__)
        if module == "xlanb":
            taken = self.env.temp_data.setdefault("xlanb_api_taken", set())
            import xlanb
            unknown = [n for n in names if n not in xlanb.__all__]
            if unknown:
                raise self.error(f"not in xlanb.__all__: {', '.join(unknown)}")
            taken.update(names)
        return _parse(self, api_lines(module, names))


class ApiRestDirective(SphinxDirective):
    """The names of ``xlanb.__all__`` that no ``xlanb-api`` before it on the page took."""

    def run(self):
        import xlanb
        taken = self.env.temp_data.get("xlanb_api_taken", set())
        rest = [n for n in xlanb.__all__ if n not in taken]
        return _parse(self, api_lines("xlanb", rest)) if rest else []


# ------------------------------------------------------------------------- magics

def magic_help() -> list[tuple[str, str, str]]:
    """``(kind, name, help)`` for every magic ``%load_ext xlanb`` registers: the
    docstring IPython shows for ``%name?`` (magic_arguments writes the usage and the
    options into it)."""
    from xlanb.extensions.ipython import XlaMagics
    out = []
    for kind in ("line", "cell"):
        for name in XlaMagics.magics[kind].values():
            out.append((kind, name, inspect.getdoc(getattr(XlaMagics, name)) or ""))
    return out


def _usage(kind: str, name: str, doc: str) -> tuple[str, str]:
    """The usage magic_arguments put first (argparse wraps it: joined here into one
    line), and the rest of the help."""
    m = re.match(r"::\s*\n\s*\n((?:[ \t]+\S.*\n)+)", doc)
    if m:
        usage = " ".join(m.group(1).split())
        if kind == "cell":  # magic_arguments writes a cell magic's usage with one %
            usage = "%" + usage
        return usage, doc[m.end():].strip("\n")
    prefix = "%" if kind == "line" else "%%"
    m = re.match(re.escape(prefix + name) + r"\b([^\n]*?) -- ", doc)  # "%xla_peek expr -- ..."
    return (prefix + name + m.group(1) if m else prefix + name), doc


class MagicsDirective(SphinxDirective):
    def run(self):
        lines = []
        for kind, name, doc in magic_help():
            usage, body = _usage(kind, name, doc)
            lines += [f".. magic:: {usage}", ""]
            lines += [f"   {kind.capitalize()} magic.", ""]
            lines += _literal(body)
        return _parse(self, lines)


def _parse_magic(env, sig, signode):
    from sphinx import addnodes
    signode += addnodes.desc_name(sig, sig)
    return sig.split()[0].lstrip("%")


# ---------------------------------------------------------------------- pdb commands

def pdb_help() -> list[tuple[str, str]]:
    """``(name, text)`` for every command XlaPdb adds to pdb: what ``help NAME`` prints."""
    import pdb
    from xlanb.extensions.pdb import XlaPdb
    out = []
    for attr in sorted(vars(XlaPdb)):
        if not attr.startswith("do_") or hasattr(pdb.Pdb, attr):
            continue
        buf = io.StringIO()
        dbg = XlaPdb(stdout=buf, readrc=False)
        dbg.do_help(attr[3:])
        out.append((attr[3:], buf.getvalue()))
    order = {name: i for i, name in enumerate(_pdb_order())}
    return sorted(out, key=lambda x: order.get(x[0], len(order)))


def _pdb_order() -> list[str]:
    """The commands in the order extensions/pdb.py defines them."""
    from xlanb.extensions import pdb as xpdb
    src = inspect.getsource(xpdb.XlaPdb)
    return re.findall(r"def do_(\w+)\(", src)


class PdbDirective(SphinxDirective):
    def run(self):
        lines = []
        for name, text in pdb_help():
            first, _, rest = inspect.cleandoc(text).partition("\n")
            lines += [f".. pdbcommand:: {first.strip()}", ""]
            lines += _literal(inspect.cleandoc(rest) if rest.strip() else first)
        return _parse(self, lines)


# -------------------------------------------------------------------------- settings

class Setting:
    """One ``XLANB_*`` variable or ``xlanb.config`` field, as config.py defines it."""

    def __init__(self, variable, field, meaning, takes, default, also=None):
        self.variable, self.field, self.meaning = variable, field, meaning
        self.takes, self.default, self.also = takes, default, also


def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment on it; comment-only lines marked with a leading NUL."""
    out = {}
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row = tok.start[0]
            alone = lines[row - 1].strip().startswith("#")
            # "#:" is Sphinx's mark for a comment that documents the name below it
            out[row] = ("\0" if alone else "") + tok.string.lstrip("#").lstrip(":").strip()
    return out


def _comment_above(comments: dict, line: int) -> str:
    words = []
    row = line - 1
    while comments.get(row, "").startswith("\0"):
        words.insert(0, comments[row][1:])
        row -= 1
    return " ".join(words)


def _docstring_entries(doc: str) -> dict[str, str]:
    """``XLANB_NAME`` -> its text in config.py's module docstring."""
    out, name = {}, None
    for line in doc.splitlines():
        m = re.match(r"``(XLANB_\w+)``\s*(.*)", line)
        if m:
            name = m.group(1)
            out[name] = m.group(2).strip()
        elif name and line.startswith(" "):
            out[name] += " " + line.strip()
        else:
            name = None
    return out


def _takes(check, args) -> str:
    """What a field's checker accepts, in words, from the checker and its arguments."""
    from xlanb.base import config as c
    inner = getattr(check, "__closure__", None)
    optional = check.__name__ == "check_or_none"
    if optional:
        check = inner[0].cell_contents
    name = check.__name__
    if name == "check_choice":
        text = "one of " + ", ".join(args[0])
    elif name == "check_flag":
        text = "1 or 0 (also true/false, yes/no, on/off)"
    elif name == "check_count":
        text = f"a whole number >= {args[0]}" + (f" ({args[1]})" if len(args) > 1 else "")
    elif name == "check_size":
        text = "a size in bytes, or with a K, M, G or T suffix (powers of 1024)"
    elif name == "check_seconds":
        text = "a positive number of seconds"
    elif name == "check_path":
        text = "a path"
    elif name == "check_scan":
        text = "auto, 1 or 0 (also true/false, yes/no, on/off)"
    elif name == "check_platform":
        text = "one of " + ", ".join(c.PLATFORMS) + " (or a comma-separated list of them)"
    else:
        text = (check.__doc__ or name).strip().splitlines()[0]
    return text + ("; None: off" if optional else "")


def _default_text(value, check) -> str:
    from xlanb.base.formats import format_bytes
    name = getattr(check, "__name__", "")
    if name == "check_or_none" and check.__closure__:
        name = check.__closure__[0].cell_contents.__name__
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on (1)" if value else "off (0)"
    if name == "check_size" and isinstance(value, int) and value:
        return f"{format_bytes(value)} ({value})"
    if isinstance(value, str):
        home = os.path.expanduser("~")
        return value.replace(home, "~", 1) if value.startswith(home) else repr(value)
    return repr(value)


def settings() -> list[Setting]:
    """Every setting, from xlanb/base/config.py: ``Config.__init__``'s fields (the
    variable each reads, the comment above it, the docstring's line for it, its checker,
    its value in a process with no ``XLANB_*`` set), then the launcher's variables."""
    from xlanb.base import config as c
    path = inspect.getsourcefile(c)
    source = open(path, encoding="utf-8").read()
    tree = ast.parse(source)
    comments = _comments(source)
    documented = _docstring_entries(c.__doc__ or "")
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}

    def variables_in(node) -> list[str]:
        found = []
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                found += re.findall(r"^XLANB_\w+$", sub.value)
            elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) \
                    and sub.func.id in functions and sub.func.id.startswith("_default"):
                found += variables_in(functions[sub.func.id])
        return list(dict.fromkeys(found))

    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("XLANB_")}
    try:
        clean = c.Config()  # what a process with none of the variables set starts with
    finally:
        os.environ.update(saved)
    out = []
    for stmt in init.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
        if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                and target.value.id == "self"):
            continue
        field = target.attr
        names = variables_in(stmt.value)
        variable = names[0] if names else None
        descriptor = vars(c.Config).get(field)
        check = getattr(descriptor, "check", None)
        args = getattr(descriptor, "args", ())
        takes = _takes(check, args) if check else "text"
        meaning = documented.get(variable, "") if variable else ""
        comment = _comment_above(comments, stmt.lineno) or comments.get(stmt.lineno, "")
        if not meaning:
            meaning = comment
        first = c.RENAMED_VARIABLES.get(variable)
        out.append(Setting(variable, field, meaning, takes,
                           _default_text(getattr(clean, field), check),
                           also=first))
    # the launcher's variables (xlanb.launch sets them; xlanb.distributed reads them)
    launch = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LaunchSettings")
    for stmt in launch.body:
        if isinstance(stmt, ast.AnnAssign):
            text = comments.get(stmt.lineno, "")
            m = re.match(r"(XLANB_\w+),?\s*(.*)", text)
            if m:
                out.append(Setting(m.group(1), None,
                                   "set for each process by ``python -m xlanb.launch`` "
                                   "(or another launcher), read by "
                                   "``xlanb.distributed.initialize()``"
                                   + (f": {m.group(2)}" if m.group(2) else ""),
                                   "as its launcher sets it", "unset"))
    return out


def all_variables() -> list[str]:
    """Every ``XLANB_*`` name config.py mentions (what the settings page must list)."""
    from xlanb.base import config as c
    source = open(inspect.getsourcefile(c), encoding="utf-8").read()
    return sorted(set(re.findall(r"\bXLANB_[A-Z_]+\b", source)))


def _rst_text(text: str) -> str:
    """Comment text as inline reStructuredText: stray markup characters escaped."""
    if "``" in text:
        return text
    return re.sub(r"([*`|_\\])", r"\\\1", text)


class SettingsDirective(SphinxDirective):
    def run(self):
        lines = []
        for s in settings():
            name = s.variable or f"xlanb.config.{s.field}"
            lines += [f".. setting:: {name}", ""]
            if s.meaning:
                lines += [f"   {_rst_text(s.meaning)}", ""]
            lines += [f"   :takes: {_rst_text(s.takes)}", f"   :default: {_rst_text(s.default)}"]
            if s.variable and s.field:
                lines += [f"   :at run time: ``xlanb.config.{s.field}``"]
            if s.also:
                lines += [f"   :first name: ``{s.also}`` (still read)"]
            lines += [""]
        return _parse(self, lines)


def _parse_setting(env, sig, signode):
    from sphinx import addnodes
    signode += addnodes.desc_name(sig, sig)
    return sig


def _parse_pdb(env, sig, signode):
    from sphinx import addnodes
    signode += addnodes.desc_name(sig, sig)
    return sig.split()[0]


# ------------------------------------------------------------------ command-line tools

def command_help(module: str, args: list[str]) -> str:
    """What ``python -m MODULE ARGS --help`` prints, from the module's own ``main``."""
    import contextlib
    import importlib
    mod = importlib.import_module(module)
    main = getattr(mod, "main", None) or importlib.import_module(module + ".__main__").main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main([*args, "--help"])
        except SystemExit:
            pass
    return out.getvalue()


class CommandHelpDirective(SphinxDirective):
    required_arguments = 1
    optional_arguments = 4

    def run(self):
        module, *args = self.arguments
        text = command_help(module, args)
        if not text.strip():
            raise self.error(f"python -m {module} {' '.join(args)} --help printed nothing")
        return _parse(self, _literal(text, indent=""))


def setup(app):
    app.add_object_type("magic", "magic", "pair: %s; IPython magic", parse_node=_parse_magic,
                        objname="IPython magic")
    app.add_object_type("pdbcommand", "pdbcommand", "pair: %s; pdb command",
                        parse_node=_parse_pdb, objname="pdb command")
    app.add_object_type("setting", "setting", "pair: %s; setting", parse_node=_parse_setting,
                        objname="setting")
    app.connect("autodoc-process-docstring", docstring_as_written)
    app.add_directive("xlanb-api", ApiDirective)
    app.add_directive("xlanb-api-rest", ApiRestDirective)
    app.add_directive("xlanb-magics", MagicsDirective)
    app.add_directive("xlanb-pdb-commands", PdbDirective)
    app.add_directive("xlanb-settings", SettingsDirective)
    app.add_directive("xlanb-command-help", CommandHelpDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
