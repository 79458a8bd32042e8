"""The CI definitions ``kliqued ci init`` writes: GitHub Actions and GitLab CI.

Each validates the estate, plans the pull request with the what-if against the control
plane (the job's own ID token, no stored secret: GitHub's ``id-token: write``, GitLab's
``id_tokens``; the estate trusts the CI issuer for its repository in
``settings.identity.workloads`` and the job acts as ``role:planner``: the plan reads the live
counts and the last weeks' demand, and says when the base is not the revision in force), keeps the plan in
one pull-request comment (``kliqued ci comment``) and fails the check on an invalid estate
or an error-level impact only (a plan's exit 2, "changes", is not a failure).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from .install import Install

GITHUB_PATH = ".github/workflows/klique-plan.yml"
GITLAB_PATH = ".gitlab/klique-plan.gitlab-ci.yml"


@dataclass(frozen=True)
class Options:
    install: Install
    """What ``pip install`` is given: a source the organisation pins (``install.parse``)."""
    estate_path: str = "estate"
    since: str = "14d"
    """The what-if's window of demand."""
    python: str = "3.12"


GITHUB = """\
# Written by `kliqued ci init github` (docs/gitops.md). Set the repository variable
# KLIQUE_URL (the control plane; several daemons comma-separated); without it the plan
# compares the two revisions only. No secret: the job proves who it is with its own ID token
# (id-token: write below), which the estate trusts for this repository (docs/identity.md):
#   settings: {{identity: {{workloads: [{{name: github, audience: klique,
#     issuer: "https://token.actions.githubusercontent.com",
#     claims: {{repository: your-org/your-estate}}}}]}}}}
name: klique-plan

on:
  pull_request:
    paths:
      - "{estate}/**"
      - "{workflow}"

permissions:
  contents: read
  pull-requests: write  # to post and update the plan comment
  id-token: write  # the job's ID token: kliqued plan reads the live counts with it

concurrency:  # a new push cancels the run for the previous one
  group: klique-plan-${{{{ github.event.pull_request.number }}}}
  cancel-in-progress: true

jobs:
  plan:
    runs-on: ubuntu-latest
    env:
      KLIQUE_URL: ${{{{ vars.KLIQUE_URL }}}}
      KLIQUE_AUDIENCE: ${{{{ vars.KLIQUE_AUDIENCE || 'klique' }}}}  # settings.identity's audience
    steps:
      - uses: actions/checkout@v5
        with:
          fetch-depth: 0  # the plan reads the base branch from git history

      - uses: actions/setup-python@v6
        with:
          python-version: "{python}"

      # {install_comment}
      - name: Install kliqued
        run: pip install "{install}"

      - name: Validate
        id: validate
        continue-on-error: true  # post the plan comment anyway; the last step fails the job
        run: kliqued validate --strict --format github "{estate}"

      - name: Plan, with the what-if against the control plane
        id: plan
        run: |
          live=()
          if [ -n "$KLIQUE_URL" ]; then
            live=(--against "$KLIQUE_URL" --what-if-from "$KLIQUE_URL" --since "{since}")
          fi
          set +e
          kliqued plan --base "origin/$GITHUB_BASE_REF" --estate-path "{estate}" \\
            --format markdown -o plan.md "${{live[@]}}"
          code=$?
          set -e
          echo "exit_code=$code" >> "$GITHUB_OUTPUT"
          if [ -f plan.md ]; then cat plan.md >> "$GITHUB_STEP_SUMMARY"; fi
          echo "kliqued plan exited with $code (0 no changes, 2 changes, 1 must be fixed)"

      - name: Post or update the plan comment
        if: >-
          github.event.pull_request.head.repo.full_name == github.repository &&
          hashFiles('plan.md') != ''
        env:
          GITHUB_TOKEN: ${{{{ secrets.GITHUB_TOKEN }}}}
        run: kliqued ci comment github --file plan.md  # the pull request of GITHUB_EVENT_PATH

      - name: Fail on an invalid estate or an error-level impact
        if: steps.validate.outcome == 'failure' || steps.plan.outputs.exit_code == '1'
        env:
          VALIDATE: ${{{{ steps.validate.outcome }}}}
          PLAN_EXIT: ${{{{ steps.plan.outputs.exit_code }}}}
        run: |
          echo "validate: $VALIDATE, plan exit code: $PLAN_EXIT"
          exit 1
"""

GITLAB = """\
# Written by `kliqued ci init gitlab` (docs/gitops.md). Include it from .gitlab-ci.yml:
#   include:
#     - local: {workflow}
# CI/CD variables: KLIQUE_URL (the control plane; several daemons comma-separated) and
# KLIQUE_BOT_TOKEN (masked: a project access token, role Reporter, scope api, to post the
# plan note). No Klique secret: the job's ID token (id_tokens below) proves who it is, and
# the estate trusts GitLab for this project (docs/identity.md):
#   settings: {{identity: {{workloads: [{{name: gitlab, audience: klique,
#     issuer: "https://gitlab.com", claims: {{project_path: "group/estate"}}}}]}}}}
klique-plan:
  image: python:{python}
  rules:
    - if: $CI_PIPELINE_SOURCE == "merge_request_event"
      changes:
        - "{estate}/**/*"
        - "{workflow}"
  variables:
    GIT_DEPTH: "0"
  id_tokens:
    KLIQUE_ID_TOKEN:  # kliqued plan reads the live counts with it
      aud: klique  # settings.identity's audience
  script:
    # {install_comment}
    - pip install "{install}"
    - git fetch origin "$CI_MERGE_REQUEST_TARGET_BRANCH_NAME"
    - kliqued validate --strict "{estate}" || invalid=1
    - |
      live=""
      if [ -n "$KLIQUE_URL" ]; then
        live="--against $KLIQUE_URL --what-if-from $KLIQUE_URL --since {since}"
      fi
      set +e
      kliqued plan --base "origin/$CI_MERGE_REQUEST_TARGET_BRANCH_NAME" \
        --estate-path "{estate}" --format markdown -o plan.md $live
      code=$?
      set -e
    - kliqued ci comment gitlab --file plan.md
    - test -z "$invalid" && test "$code" -ne 1
"""


def _comment(o: Options, indent: str) -> str:
    """The install step's comment, wrapped at the file's width under its indentation."""
    return f"\n{indent}# ".join(textwrap.wrap(o.install.comment, 88 - len(indent)))


def github(o: Options) -> str:
    return GITHUB.format(
        estate=o.estate_path,
        workflow=GITHUB_PATH,
        python=o.python,
        install=o.install.spec,
        install_comment=_comment(o, " " * 6),
        since=o.since,
    )


def gitlab(o: Options) -> str:
    return GITLAB.format(
        estate=o.estate_path,
        workflow=GITLAB_PATH,
        python=o.python,
        install=o.install.spec,
        install_comment=_comment(o, " " * 4),
        since=o.since,
    )


WRITERS = {"github": (GITHUB_PATH, github), "gitlab": (GITLAB_PATH, gitlab)}

ADVISE_GITHUB_PATH = ".github/workflows/klique-advise.yml"

ADVISE_GITHUB = """\
# Written by `kliqued ci init github --advise` (docs/advisor.md). Every Monday: `kliqued
# advise` replays the last weeks' demand of the control plane on the estate, and when a
# change would have shortened a group's waits without lengthening another's by more than
# 10%, opens a pull request with the patch and the report (the plan workflow then runs on
# it). Needs the repository variable KLIQUE_URL. No Klique secret: the job reads the demand
# with its own ID token (id-token: write below), which the estate trusts for this
# repository as a planner (settings.identity.workloads; docs/identity.md).
name: klique-advise

on:
  schedule:
    - cron: "17 6 * * 1"
  workflow_dispatch:

permissions:
  contents: write
  pull-requests: write
  id-token: write  # the job's ID token: kliqued advise reads the demand with it

jobs:
  advise:
    runs-on: ubuntu-latest
    env:
      KLIQUE_URL: ${{{{ vars.KLIQUE_URL }}}}
      KLIQUE_AUDIENCE: ${{{{ vars.KLIQUE_AUDIENCE || 'klique' }}}}  # settings.identity's audience
      GH_TOKEN: ${{{{ secrets.GITHUB_TOKEN }}}}
    steps:
      - uses: actions/checkout@v5

      - uses: actions/setup-python@v6
        with:
          python-version: "{python}"

      # {install_comment}
      - name: Install kliqued
        run: pip install "{install}"

      - name: Advise from the last weeks' demand
        run: |
          kliqued advise --estate "{estate}" --against "$KLIQUE_URL" --since "{since}" \\
            --patch advice.patch -o advice.md
          cat advice.md >> "$GITHUB_STEP_SUMMARY"

      - name: Open a pull request with the kept changes
        run: |
          if [ ! -s advice.patch ]; then echo "no change to propose"; exit 0; fi
          branch="klique-advice/$(date -u +%Y-%m-%d)"
          git config user.name "klique-advise"
          git config user.email "klique-advise@users.noreply.github.com"
          git switch -c "$branch"
          git apply advice.patch
          git commit -am "Estate changes advised by kliqued advise (last {since})"
          git push origin "$branch"
          gh pr create --title "Klique advice: $(date -u +%Y-%m-%d)" --body-file advice.md
"""


ADVISE_GITLAB_PATH = ".gitlab/klique-advise.gitlab-ci.yml"

ADVISE_GITLAB = """\
# Written by `kliqued ci init gitlab --advise` (docs/advisor.md). Include it from
# .gitlab-ci.yml (include: - local: {workflow}) and add a pipeline schedule (Build >
# Pipeline schedules, e.g. "17 6 * * 1") with the variable KLIQUE_ADVISE=1: `kliqued
# advise` replays the last weeks' demand of the control plane on the estate, and when a
# change would have shortened a group's waits without lengthening another's by more than
# 10%, pushes a branch that opens a merge request with the patch (the plan job then runs on
# it). CI/CD variables: KLIQUE_URL, and KLIQUE_BOT_TOKEN (masked: a project access token,
# role Developer, scope write_repository, to push the branch). No Klique secret: the job's
# ID token (id_tokens below) proves who it is, and the estate trusts GitLab for this
# project as a planner (settings.identity.workloads; docs/identity.md).
klique-advise:
  image: python:{python}
  rules:
    - if: $CI_PIPELINE_SOURCE == "schedule" && $KLIQUE_ADVISE == "1"
  id_tokens:
    KLIQUE_ID_TOKEN:  # kliqued advise reads the demand with it
      aud: klique  # settings.identity's audience
  script:
    # {install_comment}
    - pip install "{install}"
    - kliqued advise --estate "{estate}" --against "$KLIQUE_URL" --since "{since}"
      --patch advice.patch -o advice.md
    - cat advice.md
    - |
      if [ ! -s advice.patch ]; then echo "no change to propose"; exit 0; fi
      branch="klique-advice/$(date -u +%Y-%m-%d)"
      git config user.name "klique-advise"
      git config user.email "klique-advise@noreply.invalid"
      git switch -c "$branch"
      git apply advice.patch
      git commit -am "Estate changes advised by kliqued advise (last {since})"
      git push "https://klique-advise:${{KLIQUE_BOT_TOKEN}}@${{CI_SERVER_HOST}}/${{CI_PROJECT_PATH}}.git" \
        "$branch" -o merge_request.create -o merge_request.target="$CI_DEFAULT_BRANCH" \
        -o merge_request.title="Klique advice: $(date -u +%Y-%m-%d)" \
        -o merge_request.description="$(head -c 60000 advice.md)"
  artifacts:
    paths: [advice.md, advice.patch]
    when: always
"""


def gitlab_advise(o: Options) -> str:
    return ADVISE_GITLAB.format(
        estate=o.estate_path,
        workflow=ADVISE_GITLAB_PATH,
        python=o.python,
        install=o.install.spec,
        install_comment=_comment(o, " " * 4),
        since=o.since,
    )


def github_advise(o: Options) -> str:
    return ADVISE_GITHUB.format(
        estate=o.estate_path,
        python=o.python,
        install=o.install.spec,
        install_comment=_comment(o, " " * 6),
        since=o.since,
    )


ADVISE_WRITERS = {
    "github": (ADVISE_GITHUB_PATH, github_advise),
    "gitlab": (ADVISE_GITLAB_PATH, gitlab_advise),
}
