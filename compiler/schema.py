"""The JSON Schema of one estate file, generated from the models (never written by hand)."""

from __future__ import annotations

import json
from typing import Any

from .models import EstateFile

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def estate_schema() -> dict[str, Any]:
    schema = EstateFile.model_json_schema(mode="validation")
    return {"$schema": SCHEMA_DIALECT, **schema}


def estate_schema_text() -> str:
    return json.dumps(estate_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
