"""answer_format "json": the answer as a JSON object a program can read, {"answer": text, "citations":
[source numbers]}, generated under a JSON schema whose citations can only be the numbers of the
sources given, and checked again when the answer is complete."""
import json

FORMATS = ("text", "json")
# vLLM's guided-decoding keys: answer_format json sets the constraint, so the request may not.
GUIDED_KEYS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")
INSTRUCTION = ('\n\nReply with a JSON object only: {"answer": "<your answer>", "citations": [<the numbers of '
               'the passages you used>]}.')


def answer_schema(num_sources: int, max_chars: int) -> dict:
    """The answer at most `max_chars` characters, so it closes (and parses) within its max_tokens."""
    citation = {"enum": list(range(1, num_sources + 1))} if num_sources else {"type": "integer"}
    return {"type": "object", "additionalProperties": False, "required": ["answer", "citations"],
            "properties": {"answer": {"type": "string", "maxLength": max_chars},
                           "citations": {"type": "array", "items": citation, "maxItems": num_sources}}}


def constrained(sampling_parameters: str | None, messages: str, num_sources: int,
                max_chars: int) -> tuple[str, str]:
    """The llm's sampling_parameters with the answer's schema, and the messages with the instruction;
    ValueError when the request constrains the output itself."""
    sampling = json.loads(sampling_parameters) if sampling_parameters else {}
    if not isinstance(sampling, dict):
        raise ValueError("sampling_parameters must be a JSON object")
    taken = [key for key in GUIDED_KEYS if key in sampling]
    if taken:
        raise ValueError(f"answer_format 'json' sets the output's schema; remove {taken} from sampling_parameters")
    sampling["guided_json"] = answer_schema(num_sources, max_chars)
    chat = json.loads(messages)
    chat[-1] = {**chat[-1], "content": chat[-1]["content"] + INSTRUCTION}
    return json.dumps(sampling), json.dumps(chat)


def check(text: str, num_sources: int) -> str | None:
    """Why a complete answer does not follow the format; None when it does."""
    try:
        answer = json.loads(text)
    except ValueError as exc:
        return f"not JSON ({exc})"
    if not isinstance(answer, dict) or set(answer) != {"answer", "citations"}:
        return "not an object of answer and citations"
    if not isinstance(answer["answer"], str) or not isinstance(answer["citations"], list):
        return "answer must be a string and citations a list"
    unknown = [n for n in answer["citations"] if not (isinstance(n, int) and 1 <= n <= num_sources)]
    if unknown:
        return f"citations {unknown} name no source given (1 to {num_sources})"
    return None
