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


def validate(path: Path, version: str = VERSION) -> list[str]:
    """The failed checks of ``path`` (a FOCUS CSV) against the validator's ``version`` rules,
    and any check of :data:`NOT_APPLICABLE` that the validator no longer has (so the list
    stays true); empty when it passes."""
    from focus_validator.config_objects.common import ChecklistObjectStatus
    from focus_validator.data_loaders.data_loader import DataLoader
    from focus_validator.rules.spec_rules import SpecRules
    from focus_validator.validator import DEFAULT_VERSION_SETS_PATH

    import focus_validator

    override = Path(path).with_suffix(".override.yaml")
    override.write_text("overrides:\n" + "".join(f"  - {k}\n" for k in NOT_APPLICABLE))
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
        if check.status == ChecklistObjectStatus.SKIPPED and name in NOT_APPLICABLE:
            continue
        if check.status != ChecklistObjectStatus.PASSED:
            failed.append(
                f"{name}: {check.status.value}: "
                f"{getattr(check, 'friendly_name', '') or ''} "
                f"{getattr(check, 'error', '') or ''}".strip()
            )
    failed += [
        f"{name}: listed as not applicable but not a check of the validator"
        for name in NOT_APPLICABLE
        if name not in result.checklist
    ]
    return sorted(failed)
