"""Hypothesis strategies of bad requests, each a `Case` wrong in exactly one way, so that the field
its error must name is known: tensor-level mistakes that Triton itself refuses (dtype, shape,
missing or unknown input) from a model's config, and value-level ones per kind of input."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from bad_input import CONFIG_TYPES, NUMPY, Case, Tensors, retyped

INT64 = (-(1 << 63), (1 << 63) - 1)
FINITE = dict(allow_nan=False, allow_infinity=False)


def _not_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def with_(valid: Tensors, **changes) -> Tensors:
    """`valid` with some tensors replaced (a value of None drops the tensor)."""
    merged = {**valid, **changes}
    return {name: t for name, t in merged.items() if t is not None}


def texts_array(texts: list[bytes]) -> tuple[np.ndarray, str]:
    return np.array(texts, dtype=np.object_), "BYTES"


# --- tensor level: Triton checks these before the model runs ---------------------------------

def triton_cases(valid: Tensors, config: dict, missing: bool = True) -> st.SearchStrategy[Case]:
    """Wrong dtype, an extra axis, a fixed dim of the wrong size, a required input missing (unless
    `missing` is False), an unknown input: each names the input. `config` is the model's config as
    the HTTP API gives it."""
    declared = {t["name"]: t for t in config["input"]}
    names = sorted(valid)

    def wrong_dtype(name):
        others = [d for d in NUMPY if d != CONFIG_TYPES[declared[name]["data_type"]]]
        return st.sampled_from(others).map(lambda d: Case(with_(valid, **{name: retyped(valid[name][0], d)}), (name,)))

    def extra_axis(name):
        array, dtype = valid[name]
        return st.just(Case(with_(valid, **{name: (array[..., None], dtype)}), (name,)))

    def fixed_dim_wrong(name):
        array, dtype = valid[name]
        return st.integers(2, 5).map(lambda n: Case(with_(valid, **{name: (np.repeat(array, n, axis=-1), dtype)}), (name,)))

    options = [wrong_dtype(n) for n in names] + [extra_axis(n) for n in names]
    options += [fixed_dim_wrong(n) for n in names if declared[n]["dims"][-1] > 0]
    # Triton 2.51 does not check that an ensemble with optional inputs got its required ones: the
    # ensemble stops with its own "no more ensemble steps can be made", which does not name the input.
    stopped = ("no more ensemble steps can be made",) if config.get("platform") == "ensemble" else ()
    options += [st.just(Case(with_(valid, **{n: None}), (n, *stopped))) for n in names
                if missing and not declared[n].get("optional")]
    unknown = st.from_regex(r"\A[a-z][a-z_]{0,12}\Z").filter(lambda n: n not in declared)
    options.append(unknown.map(lambda n: Case({**valid, n: (np.ones([1], np.int32), "INT32")}, (n,))))
    return st.one_of(options)


def out_of_range(valid: dict, name: str, most: int):
    """An INT32 [1] input outside 1..most."""
    return st.one_of(st.integers(-(1 << 31), 0), st.integers(most + 1, (1 << 31) - 1)).map(
        lambda k: Case(valid | {name: (np.array([k], np.int32), "INT32")}, (name,)))


# --- texts (tokenizers, embed, rerank, queries) ----------------------------------------------

def good_text() -> st.SearchStrategy[bytes]:
    return st.text(min_size=1, max_size=30).filter(str.strip).map(str.encode)


def bad_text(limit_bytes: int) -> st.SearchStrategy[bytes]:
    """Blank, not UTF-8, or over the byte limit."""
    return st.one_of(
        st.text(alphabet=" \t\n\r\u00a0\u2003\u3000", max_size=20).map(str.encode),
        st.binary(min_size=1, max_size=64).filter(_not_utf8),
        st.integers(limit_bytes + 1, 4 * limit_bytes).map(lambda n: b"x" * n))


def texts_cases(valid: Tensors, name: str, most: int, limit_bytes: int) -> st.SearchStrategy[Case]:
    """One bad text among good ones (the error names `name[i]`), or a count outside 1..most."""
    def place(goods):
        return st.tuples(st.integers(0, len(goods)), bad_text(limit_bytes)).map(
            lambda t: Case(with_(valid, **{name: texts_array(goods[:t[0]] + [t[1]] + goods[t[0]:])}),
                           (f"{name}[{t[0]}]",)))
    one_bad = st.lists(good_text(), max_size=min(most - 1, 6)).flatmap(place)
    counts = st.sampled_from([0, most + 1, 3 * most]).map(
        lambda n: Case(with_(valid, **{name: texts_array([b"ok"] * n)}), (f"{name}: {n} texts",)))
    return st.one_of(one_bad, counts)


def query_cases(valid: Tensors, limit_bytes: int, field: str) -> st.SearchStrategy[Case]:
    """A bad single query ([1]); `field` is what the error calls it."""
    return bad_text(limit_bytes).map(lambda q: Case(with_(valid, query=texts_array([q])), (field,)))


# --- token ids (embedder, reranker) ----------------------------------------------------------

def token_cases(limits: dict, max_batch: int) -> st.SearchStrategy[Case]:
    """Right-padded [N, S] ids with one mistake; `limits` is the graph's `token_inputs` metadata."""
    def build(rows, length, ids=None, mask=None, types=None):
        ids = np.ones((rows, length), np.int64) if ids is None else ids
        return {"input_ids": (ids, "INT64"),
                "attention_mask": (np.ones_like(ids) if mask is None else mask, "INT64"),
                "token_type_ids": (np.zeros_like(ids) if types is None else types, "INT64")}

    def poke(rows, length, name, value):
        tensors = build(rows, length)
        array = tensors[name][0].copy()
        array[rows - 1, length - 1] = value
        return Case({**tensors, name: (array, "INT64")}, (name,))

    shape = st.tuples(st.integers(1, 4), st.integers(1, 16))
    outside = lambda bound: st.one_of(st.integers(INT64[0], -1), st.integers(bound, INT64[1]))  # noqa: E731
    return st.one_of(
        st.tuples(shape, outside(limits["vocab_size"])).map(lambda t: poke(*t[0], "input_ids", t[1])),
        st.tuples(shape, outside(limits["type_vocab_size"])).map(lambda t: poke(*t[0], "token_type_ids", t[1])),
        st.tuples(shape, outside(2)).map(lambda t: poke(*t[0], "attention_mask", t[1])),
        # a row that starts with padding, or has no token at all
        shape.filter(lambda s: s[1] >= 1).map(lambda s: Case(
            build(*s, mask=np.concatenate([np.zeros((s[0], 1), np.int64), np.ones((s[0], s[1] - 1), np.int64)], 1)),
            ("attention_mask",))),
        st.one_of(st.just(0), st.integers(limits["max_length"] + 1, limits["max_length"] + 300)).map(
            lambda n: Case(build(1, n), ("input_ids",))),
        st.tuples(shape, st.sampled_from(["attention_mask", "token_type_ids"]), st.integers(1, 5)).map(
            lambda t: Case({**build(*t[0]), t[1]: (np.ones((t[0][0], t[0][1] + t[2]), np.int64), "INT64")},
                           ("must have one shape",))),
        st.integers(max_batch + 1, max_batch + 8).map(lambda n: Case(build(n, 4), ("batch-size",))))


# --- the retriever's query embedding ---------------------------------------------------------

def embedding_cases(valid: Tensors, dim: int, max_top_k: int) -> st.SearchStrategy[Case]:
    unit = valid["embedding"][0]

    def spoiled(position, value):
        array = unit.copy()
        array[0, position] = value
        return Case(with_(valid, embedding=(array, "FP32")), ("embedding",))

    return st.one_of(
        st.tuples(st.integers(0, dim - 1), st.sampled_from([np.nan, np.inf, -np.inf])).map(lambda t: spoiled(*t)),
        st.floats(float(np.float32(1e38)), float(np.finfo(np.float32).max), width=32).map(lambda v: Case(with_(valid, embedding=(np.full((1, dim), v, np.float32), "FP32")),
                                                             ("embedding",))),
        st.just(Case(with_(valid, embedding=(np.zeros((1, dim), np.float32), "FP32")), ("embedding",))),
        st.one_of(st.tuples(st.sampled_from([0, 2, 3]), st.just(dim)),
                  st.tuples(st.just(1), st.integers(1, 2 * dim).filter(lambda d: d != dim))).map(
            lambda s: Case(with_(valid, embedding=(np.ones(s, np.float32), "FP32")), ("embedding: shape",))),
        st.one_of(st.integers(-(1 << 31), 0), st.integers(max_top_k + 1, (1 << 31) - 1)).map(
            lambda k: Case(with_(valid, top_k=(np.array([k], np.int32), "INT32")), ("top_k",))))


# --- prompt_builder --------------------------------------------------------------------------

def prompt_builder_cases(valid: Tensors, max_query_chars: int, max_passages: int, max_passage_bytes: int,
                         max_top_n: int):
    lists = ("passages", "sources", "passage_ids")
    n = len(valid["passages"][0])

    def many(count):
        return Case(with_(valid, **{name: texts_array([b"p"] * count) for name in lists},
                          scores=(np.zeros((count, 1), np.float32), "FP32")), ("passages: ",))

    def not_utf8(name, raw):
        array = valid[name][0].copy()
        array[0] = raw
        return Case(with_(valid, **{name: (array, "BYTES")}), (f"{name}[0]",))

    def bad_score(position, value):
        scores = valid["scores"][0].copy()
        scores[position, 0] = value
        return Case(with_(valid, scores=(scores, "FP32")), (f"scores[{position}]",))

    return st.one_of(
        st.text(alphabet=" \t\n", max_size=5).map(lambda q: Case(with_(valid, query=texts_array([q.encode()])), ("query",))),
        st.integers(max_query_chars + 1, 3 * max_query_chars).map(
            lambda c: Case(with_(valid, query=texts_array([b"q" * c])), ("query: ",))),
        st.tuples(st.sampled_from(["query", *lists]), st.binary(min_size=1, max_size=16).filter(_not_utf8)).map(
            lambda t: not_utf8(*t)),
        st.tuples(st.sampled_from(lists), st.sampled_from([0, 1, n + 1])).map(lambda t: Case(
            with_(valid, **{t[0]: texts_array([b"x"] * t[1])}), ("one entry per passage",))),
        st.integers(max_passages + 1, 4 * max_passages).map(many),
        st.integers(max_passage_bytes + 1, 2 * max_passage_bytes).map(lambda size: Case(
            with_(valid, passages=texts_array([b"p" * size, b"p two"])), ("passages[0] is",))),
        st.tuples(st.integers(0, n - 1), st.sampled_from([np.nan, np.inf, -np.inf])).map(lambda t: bad_score(*t)),
        st.one_of(st.integers(-(1 << 31), 0), st.integers(max_top_n + 1, (1 << 31) - 1)).map(
            lambda k: Case(with_(valid, top_n=(np.array([k], np.int32), "INT32")), ("top_n",))))
