"""The API's typed models: every request body (``requests``), every answer (``responses``,
``estate``), the channels' names (``channels``), and the JSON Schema the OpenAPI document's
schemas are generated with (``schema.components``).

The one definition the daemon's document, the SDK's request bodies and the MCP tools' input
schemas all come from (issue 27, item 3), so it sits outside the daemon: it imports pydantic
and ``klique_util`` only (a contract in pyproject.toml; tests/test_api_models_imports.py),
and the SDK loads it at its first request that sends a body, not at import.
"""
