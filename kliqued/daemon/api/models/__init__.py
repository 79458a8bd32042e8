"""The API's typed models: every request body (``requests``) and most answers
(``responses``), the one definition the OpenAPI document's schemas for them are generated
from (``schema.components``)."""
