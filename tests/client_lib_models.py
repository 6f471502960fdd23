"""The Pydantic models that the LangChain and LlamaIndex tests ask for as tools and structured output: bounded
strings and numbers (the demo model is random: only the constraint ends them), and a nested model whose JSON
schema has what real applications send: `$defs` with `$ref`s, an enum, a literal, an optional field."""
from __future__ import annotations

import enum
from typing import Literal, Optional

from pydantic import BaseModel, Field


class Weather(BaseModel):
    """Weather in a city."""
    city: str = Field(max_length=10)


class City(BaseModel):
    """A city."""
    name: str = Field(max_length=10)


class Color(str, enum.Enum):
    red = "red"
    blue = "blue"


class Street(BaseModel):
    name: str = Field(max_length=8)
    number: int = Field(ge=1, le=99)


class Town(BaseModel):
    """A town."""
    name: str = Field(max_length=10, description="its name")
    kind: Literal["village", "city"]
    color: Color
    mayor: Optional[str] = Field(default=None, max_length=6)
    streets: list[Street] = Field(max_length=2)
