"""CI for an estate repository: ``kliqued ci init`` writes a ready workflow (``workflows``)
and ``kliqued ci comment`` keeps the plan in one pull-request comment (``comment``)."""
