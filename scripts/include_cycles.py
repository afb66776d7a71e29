#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""include_cycles.py - circles in the #include graph of kvpool's C modules.

Reads the #include "..." lines of every .c and .h under the roots
(daemon/, libclient/, lib/ and proto/ by default), builds the graph of
modules, prints every strongly connected component of more than one module
with the include lines that join it, and exits 1 when there are more than
--max of them (ctest's include_cycles runs it with the count we have, so
it can only go down).

A module is a family of files in one directory sharing a stem: foo.c,
foo.h and every foo_*.c / foo_*.h, where foo.c or foo.h exists (worker.c,
worker.h, worker_internal.h and worker_uds.c are module worker). A file
whose stem has no such root (disk_codec.c beside no disk.c) is a module
of its own. The shortest root wins (share_chunk_name.c is share's, not
share_chunk's). A directory named include/ counts as its parent, so an
interface header is one module with the sources that implement it.

An include is resolved as the compiler would find it here: next to the
includer first, then any scanned file whose path ends in the name (the
one nearest the includer when several do). Names that resolve to nothing
under the roots (system, libinih, kvpool.h) are not part of the graph.

Usage: scripts/include_cycles.py [--max N] [--root DIR]... [--source S]
"""

import argparse
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
DEFAULT_ROOTS = ("daemon", "libclient", "lib", "proto")


def scan(source, roots):
	"""Every .c/.h under the roots, as paths relative to source."""
	files = []
	for root in roots:
		top = os.path.join(source, root)
		if not os.path.isdir(top):
			sys.exit(f"include_cycles: no directory {top}; "
				 "pass --source (the repository) or --root")
		for d, dirs, names in os.walk(top):
			dirs.sort()
			for n in sorted(names):
				if n.endswith((".c", ".h")):
					p = os.path.join(d, n)
					files.append(os.path.relpath(p, source))
	return files


def module_dir(path):
	d = os.path.dirname(path)
	if os.path.basename(d) == "include":
		d = os.path.dirname(d)
	return d


def modules(files):
	"""file -> module name (dir/stem)."""
	stems = {}
	for f in files:
		d = module_dir(f)
		stems.setdefault(d, set()).add(os.path.splitext(os.path.basename(f))[0])
	out = {}
	for f in files:
		d = module_dir(f)
		stem = os.path.splitext(os.path.basename(f))[0]
		parts = stem.split("_")
		mod = stem
		for i in range(1, len(parts)):
			if "_".join(parts[:i]) in stems[d]:
				mod = "_".join(parts[:i])
				break
		out[f] = os.path.join(d, mod)
	return out


def common_len(a, b):
	n = 0
	for x, y in zip(a.split(os.sep), b.split(os.sep)):
		if x != y:
			break
		n += 1
	return n


def resolve(includer, name, fileset, by_base):
	near = os.path.normpath(os.path.join(os.path.dirname(includer), name))
	if near in fileset:
		return near
	cands = [f for f in by_base.get(os.path.basename(name), ())
		 if f == name or f.endswith(os.sep + name)]
	if not cands:
		return None
	return max(cands, key=lambda f: (common_len(f, includer), f))


def edges(source, files, mod):
	"""(from module, to module) -> [(file, line, included file)]."""
	fileset = set(files)
	by_base = {}
	for f in files:
		by_base.setdefault(os.path.basename(f), []).append(f)
	out = {}
	for f in files:
		with open(os.path.join(source, f), encoding="utf-8",
			  errors="replace") as fp:
			for ln, line in enumerate(fp, 1):
				m = INCLUDE.match(line)
				if not m:
					continue
				to = resolve(f, m.group(1), fileset, by_base)
				if to is None or mod[to] == mod[f]:
					continue
				out.setdefault((mod[f], mod[to]), []).append((f, ln, to))
	return out


def sccs(nodes, adj):
	"""Tarjan's strongly connected components, iteratively."""
	index, low, on, stack, comps = {}, {}, set(), [], []
	counter = 0
	for root in nodes:
		if root in index:
			continue
		work = [(root, iter(sorted(adj.get(root, ()))))]
		index[root] = low[root] = counter
		counter += 1
		stack.append(root)
		on.add(root)
		while work:
			v, it = work[-1]
			pushed = False
			for w in it:
				if w not in index:
					index[w] = low[w] = counter
					counter += 1
					stack.append(w)
					on.add(w)
					work.append((w, iter(sorted(adj.get(w, ())))))
					pushed = True
					break
				if w in on:
					low[v] = min(low[v], index[w])
			if pushed:
				continue
			work.pop()
			if work:
				u = work[-1][0]
				low[u] = min(low[u], low[v])
			if low[v] == index[v]:
				comp = []
				while True:
					w = stack.pop()
					on.discard(w)
					comp.append(w)
					if w == v:
						break
				comps.append(sorted(comp))
	return comps


def main():
	here = os.path.dirname(os.path.abspath(__file__))
	ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
	ap.add_argument("--max", type=int, default=None,
			help="exit 1 when there are more circles than this")
	ap.add_argument("--root", action="append",
			help="a directory to scan, relative to --source "
			     "(repeatable; default: %s)" % " ".join(DEFAULT_ROOTS))
	ap.add_argument("--source", default=os.path.dirname(here),
			help="the repository (default: this script's parent)")
	args = ap.parse_args()
	if args.max is not None and args.max < 0:
		ap.error("--max must be 0 or more")

	files = scan(args.source, args.root or DEFAULT_ROOTS)
	mod = modules(files)
	e = edges(args.source, files, mod)
	adj = {}
	for (a, b) in e:
		adj.setdefault(a, set()).add(b)
	comps = [c for c in sccs(sorted(set(mod.values())), adj) if len(c) > 1]
	comps.sort(key=lambda c: (-len(c), c))

	for i, c in enumerate(comps, 1):
		print(f"circle {i}: {len(c)} modules: {' '.join(c)}")
		inside = set(c)
		for (a, b) in sorted(e):
			if a in inside and b in inside:
				for f, ln, to in e[(a, b)]:
					print(f"  {a} -> {b}: {f}:{ln} includes {to}")
	n = len(comps)
	print(f"{n} circle(s) among {len(set(mod.values()))} modules "
	      f"({len(files)} files)")
	if args.max is not None and n > args.max:
		print(f"include_cycles: {n} circles, more than --max {args.max}: "
		      "a new #include closed a circle; include the lower module's "
		      "header from the upper one only (see the edges above)",
		      file=sys.stderr)
		return 1
	return 0


if __name__ == "__main__":
	sys.exit(main())
