"""Runs the FOCUS Foundation's validator (the ``focus-validator`` package, 1.0.0: the FOCUS
1.0 rules) on a file, in this process, and returns the checks that failed, each with the
validator's own description, so a test failure says which FOCUS rule broke."""

from __future__ import annotations

import contextlib
from pathlib import Path

VERSION = "1.0"
"""The newest FOCUS version focus-validator 1.0.0 has rules for."""

NOT_APPLICABLE = {
    # the validator's 1.0 rules still use FOCUS 0.5's column names; FOCUS 1.0 renamed them
    # (InvoiceIssuerName, ProviderName, PublisherName, ResourceId), and the export has the
    # 1.0 names: test_focus.py checks those are present and filled
    "InvoiceIssuer_Required": "0.5 name of InvoiceIssuerName",
    "InvoiceIssuer_IsString": "0.5 name of InvoiceIssuerName",
    "InvoiceIssuer_NotNull": "0.5 name of InvoiceIssuerName",
    "Provider_Required": "0.5 name of ProviderName",
    "Provider_IsString": "0.5 name of ProviderName",
    "Provider_NotNull": "0.5 name of ProviderName",
    "Publisher_Required": "0.5 name of PublisherName",
    "Publisher_IsString": "0.5 name of PublisherName",
    "Publisher_NotNull": "0.5 name of PublisherName",
    "ResourceID_Required": "0.5 name of ResourceId",
    "ResourceID_IsString": "0.5 name of ResourceId",
    "ResourceID_Nullable": "0.5 name of ResourceId",
    # its SQL reads ChargeType, the 0.5 name of ChargeCategory, so it fails on any 1.0 file
    "SkuPriceId_Nullable": "queries ChargeType (FOCUS 0.5)",
}
"""Checks of focus-validator 1.0.0 that do not test FOCUS 1.0 as written (or that 1.2
changed), with the reason; every other check must pass."""

PARQUET_DECIMAL = (
    "BilledCost",
    "ConsumedQuantity",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "ListCost",
    "ListUnitPrice",
    "PricingQuantity",
)
"""The columns whose ``*_IsDecimal`` check the validator cannot pass on a Parquet file that
follows FOCUS: the spec gives them the data type "Decimal", and the export writes them as
Parquet's DECIMAL(18,6) (exact amounts), but focus-validator 1.0.0 turns FOCUS's Decimal
into pandas' *float* dtype (``focus_to_pandera_schema_converter``: ``pa.Float``), which a
decimal column read by pyarrow (Python ``Decimal`` objects) never is. For a Parquet file
these checks are replaced by the test's own: each column is DECIMAL in the file
(tests/ledger/test_focus.py); a CSV has no types, so there the validator's checks run."""


def overrides_for(path: Path) -> dict[str, str]:
    """The checks skipped for ``path``, with the reason: :data:`NOT_APPLICABLE`, and for a
    Parquet file :data:`PARQUET_DECIMAL`'s."""
    out = dict(NOT_APPLICABLE)
    if Path(path).suffix == ".parquet":
        out |= {
            f"{c}_IsDecimal": "Parquet DECIMAL is FOCUS's Decimal; the validator wants float"
            for c in PARQUET_DECIMAL
        }
    return out


def validate(path: Path, version: str = VERSION) -> list[str]:
    """The failed checks of ``path`` (a FOCUS CSV or Parquet file) against the validator's ``version`` rules,
    and any check of :data:`NOT_APPLICABLE` that the validator no longer has (so the list
    stays true); empty when it passes."""
    from focus_validator.config_objects.common import ChecklistObjectStatus
    from focus_validator.data_loaders.data_loader import DataLoader
    from focus_validator.rules.spec_rules import SpecRules
    from focus_validator.validator import DEFAULT_VERSION_SETS_PATH

    import focus_validator

    skipped = overrides_for(path)
    override = Path(path).with_suffix(".override.yaml")
    override.write_text("overrides:\n" + "".join(f"  - {k}\n" for k in skipped))
    rules = SpecRules(
        override_filename=str(override),
        rule_set_path=DEFAULT_VERSION_SETS_PATH,
        rules_version=version,
        column_namespace=None,
    )
    rules.load()
    data = DataLoader(data_filename=str(Path(path).resolve())).load()
    # focus-validator 1.0.0 reads its ISO 4217 list from the relative path
    # focus_validator/utils/currency_codes.csv: from anywhere else every currency "fails"
    with contextlib.chdir(Path(focus_validator.__file__).resolve().parent.parent):
        result = rules.validate(data)
    failed = []
    for name, check in result.checklist.items():
        if check.status == ChecklistObjectStatus.SKIPPED and name in skipped:
            continue
        if name in skipped and name not in NOT_APPLICABLE:
            continue  # a dtype check the override does not reach (PARQUET_DECIMAL)
        if check.status != ChecklistObjectStatus.PASSED:
            failed.append(
                f"{name}: {check.status.value}: "
                f"{getattr(check, 'friendly_name', '') or ''} "
                f"{getattr(check, 'error', '') or ''}".strip()
            )
    failed += [
        f"{name}: listed as not applicable but not a check of the validator"
        for name in skipped
        if name not in result.checklist
    ]
    return sorted(failed)
