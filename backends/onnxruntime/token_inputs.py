"""The input contract of the encoder graphs that ragstack's exporter writes, checked per request.

Those graphs take `input_ids`, `attention_mask`, `token_type_ids` int64 [N, S], right-padded, and
record their limits in model.onnx (metadata `token_inputs`: vocab_size, type_vocab_size,
max_length). Out of those limits ONNX Runtime fails with an error naming a graph node (INTERNAL),
or, for negative ids, silently gathers another row; this check names the input and the limit.
"""
import json

import numpy as np

METADATA_KEY = "token_inputs"


class InvalidInput(ValueError):
    """The client's mistake: answered with INVALID_ARG."""


def limits_of(session) -> dict | None:
    """The graph's recorded limits, or None for a graph without them (then nothing is checked)."""
    raw = session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
    return json.loads(raw) if raw else None


def check(feed: dict[str, np.ndarray], limits: dict) -> None:
    shapes = {name: list(array.shape) for name, array in feed.items()}
    if len({tuple(shape) for shape in shapes.values()}) != 1:
        raise InvalidInput(f"input_ids, attention_mask and token_type_ids must have one shape; got {shapes}")
    rows, length = feed["input_ids"].shape
    if rows == 0 or not 1 <= length <= limits["max_length"]:
        raise InvalidInput(f"input_ids: shape [{rows}, {length}]; each row needs 1 to {limits['max_length']} tokens")
    for name, bound in (("input_ids", limits["vocab_size"]), ("token_type_ids", limits["type_vocab_size"]),
                        ("attention_mask", 2)):
        values = feed[name]
        outside = (values < 0) | (values >= bound)
        if outside.any():
            raise InvalidInput(f"{name}: value {values[outside][0]} is out of range; it must be 0 to {bound - 1}")
    # The graphs keep the first max(sum(mask)) columns: a row must be 1s then 0s, with a token at least.
    mask = feed["attention_mask"]
    real = mask.sum(axis=1)
    wrong = (real == 0) | (mask != (np.arange(length) < real[:, None])).any(axis=1)
    if wrong.any():
        raise InvalidInput(f"attention_mask: row {int(np.argmax(wrong))} must be 1s followed by 0s "
                           "(right padding), with at least one 1")
