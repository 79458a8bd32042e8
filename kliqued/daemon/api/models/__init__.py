"""The API's typed request models, the one definition the OpenAPI document's request
schemas are generated from (``schema.components``)."""
