"""Sign-in with the organisation's identity (issue 30; docs/identity.md): bearer ID and
access tokens of the providers and CI issuers the estate trusts (``settings.identity``),
verified with joserfc and mapped to a principal by the estate alone.

``fetch`` (discovery and JWKS over HTTP, on a thread, with a timeout and a size cap), ``keys``
(each issuer's keys, cached; an unknown ``kid`` refetches at most once a minute), ``verify``
(signature, algorithm, issuer, audience, times), ``mapping`` (claims -> ``Principal``: the
estate's users and roles, a workload's claim conditions). Part of the daemon's floor: it
imports no room.
"""
