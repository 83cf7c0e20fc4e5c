#!/usr/bin/env python3
"""Fail on a module cycle in any crate of the workspace.

For every crate root (`src/lib.rs`, `src/main.rs`, `src/bin/*.rs` of each crate under
`crates/`), the module tree is read from its `mod` declarations, and each module's
dependencies from the paths its code names: `crate::a::b::Item`, `super::...`,
`self::...` (in `use` trees and in expressions). A path is resolved to the module that
defines the item: through a facade's `pub use` re-exports, so `crate::mem::Region` counts
as a dependency on `mem::region`, not on `mem`. A module's `pub use` of its own descendants
(a facade) is not a dependency, nor (unless --strict) a module's use of its own
submodules: a folder's `mod.rs` may dispatch to its parts while they use its types, but two
siblings, or a part and a module outside its folder, may not depend on each other both
ways. Everything else is a dependency. Code in `#[cfg(test)]` inline modules
(and other `#[cfg(test)]` items) is left out: tests may reach anywhere.

A cycle is a strongly connected component of more than one module. Each is printed with
the line that makes each of its edges. Cycles listed in the allow file (one per line,
the modules separated by spaces, e.g. `braid: mem::region mem::registry`) are reported as
known and do not fail the check; any other cycle does (exit 1).

Usage: scripts/check-module-cycles.py [--allow FILE] [--graph] [--strict] [CRATE_DIR ...]
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def strip_comments_and_strings(src):
    """Blank out comments, string and char literals (keeping newlines and length)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', src[i:i + 20]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            end = src.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append(re.sub(r"[^\n]", " ", src[i:end]))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", src[i:j + 1]))
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}') or a lifetime ('a): only blank literals.
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", src[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(src, i):
    """Index just past the brace that closes the one at src[i] == '{'."""
    depth = 0
    for j in range(i, len(src)):
        if src[j] == "{":
            depth += 1
        elif src[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(src)


def expand_use_tree(tree):
    """`a::{b, c::{d, e as f}, self}` -> ['a::b', 'a::c::d', 'a::c::e', 'a']."""
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix, t):
        parts, depth, cur = [], 0, ""
        for ch in t:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        if cur:
            parts.append(cur)
        for p in parts:
            if "{" in p:
                head, rest = p.split("{", 1)
                walk(prefix + head, rest[:-1])
            else:
                p = re.sub(r"\bas\b.*$", "", p)
                if p == "self":
                    out.append(prefix.rstrip(":"))
                elif p:
                    out.append(prefix + p)

    walk("", tree)
    return out


class Module:
    def __init__(self, path, file, is_dir_owner):
        self.path = path  # tuple of names; () is the crate root
        self.file = file
        # mod.rs / lib.rs / main.rs own their directory; foo.rs owns foo/
        self.is_dir_owner = is_dir_owner
        self.children = {}
        self.reexports = {}  # name -> full path (tuple) it comes from
        self.globs = []  # pub use X::* targets (tuples)
        self.refs = []  # (path tuple, line, is_pub_use)
        self.items = set()


ITEM_RE = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+|async\s+|const\s+|extern\s+\"[^\"]*\"\s+)*"
    r"(?:fn|struct|enum|union|trait|type|const|static|macro_rules!)\s+([A-Za-z_][A-Za-z0-9_]*)",
    re.M,
)


def parse_crate(root_file):
    modules = {}

    def load(path, file, is_dir_owner):
        m = Module(path, file, is_dir_owner)
        modules[path] = m
        with open(file, encoding="utf-8") as f:
            raw = f.read()
        src = strip_comments_and_strings(raw)
        # Cut #[cfg(test)] items (test modules, test helpers); other inline modules' items
        # are counted as this file's.
        cut = []
        for mm in re.finditer(r"#\[cfg\(test\)\]", src):
            # The item it gates: up to its `;` or through its braced body.
            semi = src.find(";", mm.end())
            brace = src.find("{", mm.end())
            if brace < 0 or 0 <= semi < brace:
                end = len(src) if semi < 0 else semi + 1
            else:
                end = matching_brace(src, brace)
            if not cut or mm.start() >= cut[-1][1]:
                cut.append((mm.start(), end))
        for s, e in reversed(cut):
            src = src[:s] + re.sub(r"[^\n]", " ", src[s:e]) + src[e:]
        m.items = set(ITEM_RE.findall(src))
        base_dir = os.path.dirname(file) if is_dir_owner else os.path.splitext(file)[0]
        for mm in re.finditer(r"(#\[path\s*=\s*\"([^\"]+)\"\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_]\w*)\s*;", raw_masked(raw, src)):
            name = mm.group(3)
            if mm.group(2):
                child = os.path.join(os.path.dirname(file), mm.group(2))
                owner = os.path.basename(child) == "mod.rs"
            else:
                a = os.path.join(base_dir, name + ".rs")
                b = os.path.join(base_dir, name, "mod.rs")
                child, owner = (a, False) if os.path.exists(a) else (b, True)
            if not os.path.exists(child):
                continue
            m.children[name] = path + (name,)
            load(path + (name,), child, owner)
        line_of = lambda pos: src.count("\n", 0, pos) + 1
        # use declarations
        for mm in re.finditer(r"(^|[;{}\s])((?:pub(?:\([^)]*\))?\s+)?)use\s+([^;]+);", src):
            is_pub = bool(mm.group(2).strip())
            for p in expand_use_tree(mm.group(3)):
                segs = tuple(s for s in p.split("::") if s)
                if not segs:
                    continue
                m.refs.append((segs, line_of(mm.start(3)), is_pub))
                if is_pub and segs[0] in ("crate", "self", "super") or is_pub and segs[0] in m.children:
                    last = segs[-1]
                    if last == "*":
                        m.globs.append(segs[:-1])
                    else:
                        alias = re.search(r"\b" + re.escape(last) + r"\s+as\s+(\w+)", mm.group(3))
                        m.reexports[alias.group(1) if alias else last] = segs
        # paths in expressions and types
        for mm in re.finditer(r"(?<![\w:])((?:crate|super|self)(?:\s*::\s*[A-Za-z_]\w*)+)", src):
            segs = tuple(s.strip() for s in mm.group(1).split("::"))
            m.refs.append((segs, line_of(mm.start()), False))
        # paths through a child module named directly (`io::send(...)`)
        if m.children:
            kids = "|".join(re.escape(k) for k in m.children)
            for mm in re.finditer(r"(?<![\w:])((?:" + kids + r")(?:\s*::\s*[A-Za-z_]\w*)+)", src):
                segs = tuple(s.strip() for s in mm.group(1).split("::"))
                m.refs.append((segs, line_of(mm.start()), False))
        return m

    def raw_masked(raw, src):
        # mod declarations are read from the stripped source, but #[path] needs the string.
        out = list(src)
        for mm in re.finditer(r"#\[path\s*=\s*\"[^\"]+\"\]", raw):
            out[mm.start():mm.end()] = raw[mm.start():mm.end()]
        return "".join(out)

    is_owner = os.path.basename(root_file) in ("lib.rs", "main.rs", "mod.rs")
    load((), root_file, is_owner)
    return modules


def absolute(mod, segs):
    """Turn a path as written in `mod` into an absolute tuple, or None if external."""
    cur = list(mod.path)
    i = 0
    if segs[0] == "crate":
        cur, i = [], 1
    elif segs[0] in ("self", "super"):
        while i < len(segs) and segs[i] in ("self", "super"):
            if segs[i] == "super":
                if not cur:
                    return None
                cur.pop()
            i += 1
    elif segs[0] in mod.children:
        pass  # a child module named directly (`use child::X`)
    else:
        return None
    return tuple(cur) + tuple(segs[i:])


def resolve(modules, abs_path, depth=0):
    """The module that defines what abs_path names (following re-exports)."""
    cur = ()
    rest = list(abs_path)
    while rest and cur + (rest[0],) in modules:
        cur = cur + (rest.pop(0),)
    if not rest or depth > 20:
        return cur
    m = modules[cur]
    name = rest[0]
    if name in m.items:
        return cur
    if name in m.reexports:
        target = absolute(m, m.reexports[name])
        if target is not None:
            return resolve(modules, target + tuple(rest[1:]), depth + 1)
    for g in m.globs:
        target = absolute(m, g)
        if target is None:
            continue
        t = resolve(modules, target, depth + 1)
        if t in modules and name in (modules[t].items | set(modules[t].reexports)):
            return resolve(modules, t + tuple(rest), depth + 1)
    return cur


def is_descendant(a, b):
    return len(a) > len(b) and a[: len(b)] == b


def graph(modules, strict):
    edges = {}
    for path, m in modules.items():
        for segs, line, is_pub in m.refs:
            a = absolute(m, segs)
            if a is None:
                continue
            target = resolve(modules, a)
            if target == path:
                continue
            if is_descendant(target, path) and (is_pub or not strict):
                # A facade re-exporting its own children; and (unless --strict) a module
                # using its own submodules, as a folder's mod.rs dispatching to its parts.
                continue
            if is_descendant(path, target):
                # A path through an ancestor counts only when the ancestor itself defines
                # what is named (`super::sibling::X` resolved no further is not one).
                nxt = a[len(target)] if len(a) > len(target) else None
                if nxt is None or not (nxt in modules[target].items or nxt == "*" and modules[target].items):
                    continue
            edges.setdefault(path, {}).setdefault(target, (m.file, line))
    return edges


def sccs(nodes, edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            strong(v)
    return out


def name(path):
    return "::".join(path) or "crate"


def roots(crate_dir):
    src = os.path.join(crate_dir, "src")
    found = []
    for f in ("lib.rs", "main.rs"):
        if os.path.exists(os.path.join(src, f)):
            found.append(os.path.join(src, f))
    bins = os.path.join(src, "bin")
    if os.path.isdir(bins):
        for f in sorted(os.listdir(bins)):
            p = os.path.join(bins, f)
            if f.endswith(".rs"):
                found.append(p)
            elif os.path.exists(os.path.join(p, "main.rs")):
                found.append(os.path.join(p, "main.rs"))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--allow", default=os.path.join(ROOT, "scripts", "module-cycles.allow"))
    ap.add_argument("--graph", action="store_true", help="print every module's dependencies")
    ap.add_argument(
        "--strict",
        action="store_true",
        help="count a module's use of its own submodules too (then a mod.rs that calls its "
        "children while they use its types is a cycle)",
    )
    ap.add_argument("crates", nargs="*")
    args = ap.parse_args()
    crates = args.crates or sorted(
        os.path.join(ROOT, "crates", d) for d in os.listdir(os.path.join(ROOT, "crates"))
        if os.path.exists(os.path.join(ROOT, "crates", d, "Cargo.toml"))
    )
    allowed = set()
    if os.path.exists(args.allow):
        with open(args.allow) as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if line:
                    crate, mods = line.split(":", 1)
                    allowed.add((crate.strip(), frozenset(mods.split())))
    failed = 0
    known = 0
    count = 0
    for crate_dir in crates:
        crate = os.path.basename(os.path.normpath(crate_dir))
        for root in roots(crate_dir):
            modules = parse_crate(root)
            count += len(modules)
            edges = graph(modules, args.strict)
            label = crate if root.endswith("lib.rs") else f"{crate} ({os.path.relpath(root, crate_dir)})"
            if args.graph:
                for a in sorted(edges):
                    print(f"{label}: {name(a)} -> {', '.join(name(b) for b in sorted(edges[a]))}")
            for comp in sccs(modules.keys(), edges):
                key = (crate, frozenset(name(p) for p in comp))
                tag = "known module cycle (allowed)" if key in allowed else "module cycle"
                print(f"{tag} in {label}: {' <-> '.join(name(p) for p in comp)}")
                members = set(comp)
                for a in comp:
                    for b, (file, line) in sorted(edges.get(a, {}).items()):
                        if b in members:
                            rel = os.path.relpath(file, ROOT)
                            print(f"    {name(a)} -> {name(b)}  ({rel}:{line})")
                if key in allowed:
                    known += 1
                else:
                    failed += 1
    print(f"module cycles: {count} modules checked, {failed} cycle(s), {known} known and allowed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
