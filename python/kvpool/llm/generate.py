# SPDX-License-Identifier: MIT
"""kvpool.llm.generate: :class:`SamplingParams`, and :class:`ChunkedLLM`'s
model side as a mixin: forwards through a :class:`kvpool.cascade.Plan`,
prefills of entries (stored through their fill leases), sampling and the
decode loop over composed chains."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

from ..cascade import Level, Plan
from .blocks import _Seq
from .chunks import IncompatibleChunksError

__all__ = ["SamplingParams"]


@dataclass
class SamplingParams:
    """temperature (0: greedy), max_tokens, top_p, top_k (0: off), seed (None:
    random), stop_token_ids, ignore_eos. ChunkedLLM takes a dict with these
    keys, an object with these attributes (nano-vllm's SamplingParams), or
    None (the defaults)."""

    temperature: float = 1.0
    max_tokens: int = 64
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None
    stop_token_ids: Tuple[int, ...] = ()
    ignore_eos: bool = False

    @classmethod
    def of(cls, sp: Any) -> "SamplingParams":
        if sp is None or sp is ... or (isinstance(sp, (set, frozenset)) and sp <= {...}):
            return cls()      # None, or the seeds' placeholder `{...}`: the defaults
        if isinstance(sp, (set, frozenset, str, bytes, list, tuple)):
            raise TypeError(f"sampling_params: a dict, a SamplingParams or None, not "
                            f"{type(sp).__name__} {sp!r}")
        if isinstance(sp, SamplingParams):
            return sp
        get = (lambda k, d: sp.get(k, d)) if isinstance(sp, Mapping) \
            else (lambda k, d: getattr(sp, k, d))
        if isinstance(sp, Mapping):
            unknown = set(sp) - {"temperature", "max_tokens", "top_p", "top_k", "seed",
                                 "stop_token_ids", "stop", "ignore_eos"}
            if unknown:
                raise ValueError(f"sampling_params: unknown keys {sorted(unknown)}")
        stop = get("stop_token_ids", None)
        if stop is None:
            s = get("stop", None)
            stop = s if isinstance(s, (list, tuple)) and all(isinstance(t, int) for t in s) \
                else ()
        p = cls(temperature=float(get("temperature", 1.0)),
                max_tokens=int(get("max_tokens", 64)),
                top_p=float(get("top_p", 1.0) or 1.0), top_k=int(get("top_k", 0) or 0),
                seed=get("seed", None), stop_token_ids=tuple(int(t) for t in stop),
                ignore_eos=bool(get("ignore_eos", False)))
        if p.max_tokens < 1:
            raise ValueError("sampling_params: max_tokens is at least 1")
        if p.temperature < 0 or not 0 < p.top_p <= 1 or p.top_k < 0:
            raise ValueError(f"sampling_params: temperature >= 0, 0 < top_p <= 1, top_k >= 0 "
                             f"({p})")
        return p



def _is_sampling(x: Any) -> bool:
    """Whether a positional argument is sampling params (not a context)."""
    if isinstance(x, SamplingParams) or x is ... or \
            (isinstance(x, (set, frozenset)) and x <= {...}):
        return True
    if isinstance(x, Mapping):
        return True
    return not isinstance(x, (str, bytes, list, tuple)) and hasattr(x, "temperature")



class GenerateMixin:
    """ChunkedLLM's model side: forwards, prefills, sampling and the decode
    loop (``_generate``), whose rows end in private sequences (_Seq)."""

    # Set by ChunkedLLM.__init__.
    adapter: Any
    client: Any
    device: Any
    page_tokens: int
    prefill_chunk: int
    keep_chain_kv: bool
    eos_token_id: Optional[int]
    counters: Dict[str, int]
    _caches: Any
    _seqs: Dict[int, _Seq]

    # ------------------------------------------------------------ forward
    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, plan: Plan) -> torch.Tensor:
        dev = getattr(self.adapter, "device", None) or self.device
        self.counters["forwards"] += 1
        with torch.no_grad():
            return self.adapter.forward(tokens.to(dev), positions.to(dev), plan).float()

    def _prefill(self, tokens: Sequence[int], start: int, past: List[Level],
                 lease: Any, first: int = 0, kind: str = "prefill_tokens"
                 ) -> torch.Tensor:
        """Compute tokens at positions start.. (one row) over the past levels,
        storing their K/V at tokens first.. of ``lease``'s page table (whose
        tokens before ``first`` are earlier tokens of the same span) through
        libkvpool, so its lease checks cover the writes. Long spans go in
        pieces of prefill_chunk. Returns the last logits [vocab]."""
        P = self.page_tokens
        table = lease.kv_indices()
        n = len(tokens)
        logits = None
        done = 0
        while done < n:
            m = min(self.prefill_chunk, n - done)
            levels = list(past)
            if first + done:
                levels.append(Level.from_tables([(table, first + done, 1)], P))
            store = [(lease, first + done - lease.len)]  # through libkvpool
            plan = Plan(self._caches, 1, m, levels, store=store, device=self.device)
            t = torch.tensor([list(tokens[done:done + m])], dtype=torch.int64)
            pos = torch.arange(start + done, start + done + m, dtype=torch.int64)[None]
            logits = self._forward(t, pos, plan)[0]
            done += m
        self.counters[kind] += n
        return logits

    def _sync(self) -> None:
        if getattr(self.client, "cuda_device", -1) >= 0 and torch.cuda.is_available():
            torch.cuda.current_stream(self.client.cuda_device).synchronize()

    def _seal(self, reg: Dict[str, Any]) -> None:
        self._sync()
        lease = reg.get("lease")
        if lease is not None and hasattr(lease, "seal"):
            lease.seal()
        else:
            self.client.chunk_seal(reg)

    def _fill(self, reg: Dict[str, Any], tokens: Sequence[int], past: List[Level]
              ) -> torch.Tensor:
        """Prefill a created entry (root or link) and seal it; on failure
        the fill lease is released unsealed (the daemon drops the entry)."""
        lease = reg["lease"]
        try:
            if int(reg["tokens"]) != len(tokens):
                raise IncompatibleChunksError(
                    f"entry {reg['id']} has {reg['tokens']} tokens, its name {len(tokens)}")
            logits = self._prefill(tokens, int(reg["start"]), past, lease)
            self._seal(reg)
            return logits
        except BaseException:
            with contextlib.suppress(Exception):
                lease.release()
            raise

    # ------------------------------------------------------------ decode
    def _sample(self, logits: torch.Tensor, sp: SamplingParams,
                gen: Optional[torch.Generator]) -> List[int]:
        if sp.temperature <= 0:
            return logits.argmax(-1).tolist()
        x = logits.float().cpu() / sp.temperature
        if sp.top_k and sp.top_k < x.shape[-1]:
            kth = torch.topk(x, sp.top_k, dim=-1).values[..., -1:]
            x = x.masked_fill(x < kth, float("-inf"))
        if sp.top_p < 1.0:
            sx, si = torch.sort(x, dim=-1, descending=True)
            cum = sx.softmax(-1).cumsum(-1)
            drop = cum - sx.softmax(-1) > sp.top_p
            sx = sx.masked_fill(drop, float("-inf"))
            x = torch.full_like(x, float("-inf")).scatter(-1, si, sx)
        probs = x.softmax(-1)
        return torch.multinomial(probs, 1, generator=gen).reshape(-1).tolist()

    def _generate(self, levels: List[Level], base: List[int], sp: SamplingParams, *,
                  logits0: Optional[torch.Tensor] = None,
                  recompute: Optional[List[int]] = None,
                  feed: Optional[List[List[int]]] = None,
                  prefix: Optional[List[Tuple[str, ...]]] = None
                  ) -> Iterator[Tuple[int, List[Optional[int]], List[Optional[str]]]]:
        """The decode loop over B rows whose chains (``levels``) hold base[b]
        tokens. The first logits: given (logits0 [B, V]), or recomputed for
        the chain's last token (recompute: its ids; the last level is
        trimmed by one for it), or from a prefill of ``feed`` (per row, equal
        lengths) into the rows' own sequences. Yields (step, the token each
        row produced this step or None once finished, finish reasons);
        on exit the rows' sequences are committed and recorded in
        ``self._gen_rows``."""
        B = len(base)
        P = self.page_tokens
        M = sp.max_tokens
        nfeed = len(feed[0]) if feed else 0
        cap = max(nfeed + M - 1, 1)   # a sequence even for one token: it holds it as pending
        eos = None if sp.ignore_eos else self.eos_token_id
        stops = set(sp.stop_token_ids) | ({eos} if eos is not None else set())
        gen = torch.Generator().manual_seed(int(sp.seed)) if sp.seed is not None else None
        leases: List[Any] = []
        seqs: List[int] = []
        out: List[List[int]] = [[] for _ in range(B)]
        reason: List[Optional[str]] = [None] * B
        tables: List[torch.Tensor] = []
        failed = False
        try:
            for _ in range(B):
                s = self._new_seq_id()
                with self._errs():
                    leases.append(self.client.seq_create(s, [], cap))
                seqs.append(s)
            tables = [ls.kv_indices() for ls in leases]
            own = Level.from_tables([(t, cap, 1) for t in tables], P)

            def plan(n: int, written: int, extra_levels: List[Level],
                     store: bool) -> Plan:
                lv = list(extra_levels)
                if own is not None and written:
                    lv.append(own.with_lengths(written))
                # Through libkvpool: each row's lease checks its writes.
                st = [(ls, written) for ls in leases] if store else None
                return Plan(self._caches, B, n, lv, store=st, device=self.device)

            base_t = torch.tensor(base, dtype=torch.int64)
            # ---- the first logits
            if logits0 is not None:
                logits = logits0.reshape(B, -1)
            elif recompute is not None:
                trimmed = levels[:-1] + [levels[-1].trimmed(1)]
                p = Plan(self._caches, B, 1, trimmed, device=self.device)
                logits = self._forward(torch.tensor(recompute, dtype=torch.int64)[:, None],
                                       (base_t - 1)[:, None], p)
                self.counters["recompute_tokens"] += B
            else:
                assert feed is not None and nfeed > 0
                done = 0
                logits = None
                while done < nfeed:
                    m = min(self.prefill_chunk, nfeed - done)
                    p = plan(m, done, levels, True)
                    t = torch.tensor([f[done:done + m] for f in feed], dtype=torch.int64)
                    pos = base_t[:, None] + torch.arange(done, done + m)[None, :]
                    logits = self._forward(t, pos, p)
                    done += m
                self.counters["prefill_tokens"] += B * nfeed
            # ---- decode
            if self.keep_chain_kv:
                levels = [Level(lv.pages, lv.lengths, lv.row_group, lv.page_tokens,
                                keep_kv=True) for lv in levels]
            step = 0
            while True:
                toks = self._sample(logits, sp, gen)
                live: List[Optional[int]] = []
                for b in range(B):
                    if reason[b] is not None:
                        live.append(None)
                        continue
                    out[b].append(toks[b])
                    live.append(toks[b])
                    if toks[b] in stops:
                        reason[b] = "stop"
                    elif len(out[b]) >= M:
                        reason[b] = "length"
                yield step, live, list(reason)
                if all(r is not None for r in reason):
                    break
                # feed each row's last token (finished rows repeat theirs; unused)
                written = nfeed + step
                p = plan(1, written, levels, True)
                cur = torch.tensor([o[-1] for o in out], dtype=torch.int64)[:, None]
                pos = (base_t + nfeed + step)[:, None]
                logits = self._forward(cur, pos, p)
                self.counters["decode_tokens"] += B
                step += 1
        except GeneratorExit:   # a stream closed after (or before) its last token
            raise
        except BaseException:
            failed = True
            raise
        finally:
            self._sync()
            rows: List[_Seq] = []
            if failed:          # nothing half-written is kept: the sequences go
                for b, ls in enumerate(leases):
                    with contextlib.suppress(Exception):
                        ls.release()
                    self._free_seq(seqs[b])
                leases = []
            for b in range(len(leases)):
                kv = nfeed + max(len(out[b]) - 1, 0)   # tokens of this row with KV
                ls = leases[b]
                try:
                    if kv:
                        ls.commit(kv)
                finally:
                    with contextlib.suppress(Exception):
                        ls.release()
                tab = tables[b] if b < len(tables) else ls.kv_indices()
                st = _Seq(seq=seqs[b], table=tab, start=base[b], tokens=kv,
                          pending=out[b][-1:] if out[b] else [],
                          prefix=prefix[b] if prefix else (),
                          token_ids=(feed[b] if feed else []) + out[b])
                self._seqs[seqs[b]] = st
                rows.append(st)
            self._gen_rows = rows
            self._gen_out = out
            self._gen_reason = reason

    def _run(self, it: Iterator[Any]) -> None:
        for _ in it:
            pass

    def _result(self, b: int, prompt_tokens: int, **extra: Any) -> Dict[str, Any]:
        ids = list(self._gen_out[b])
        return {"text": self._decode(ids), "token_ids": ids,
                "finish_reason": self._gen_reason[b], "prompt_tokens": prompt_tokens,
                "completion_tokens": len(ids), **extra}

    def _chain_levels(self, comp: Any, rows: int) -> List[Level]:
        return [Level.from_csr(lv, self.page_tokens, rows=rows, qo_len=1)
                for lv in comp.levels]
