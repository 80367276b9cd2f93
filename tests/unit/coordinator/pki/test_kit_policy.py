"""The onboarding kit's policy template: as shipped it accepts any plan and holds every job;
pre-filled from a plan, uncommenting every clause accepts that plan (as a job: that very plan)
and refuses one that asks for more."""

from __future__ import annotations

import re
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from trellis.coordinator.jobs.job_plan import parse_job_plan
from trellis.coordinator.pki.kit_policy import EXAMPLE_OPERATOR, policy_template
from trellis.protos.plan import load_plan, parse_plan
from trellis.protos.privacy_plan import PrivacyConfig
from trellis.silo.privacy.policy import PolicyError, check_plan, load_policy


def uncommented(template: str) -> str:
    """The policy template with every clause's leading '# ' removed."""
    return re.sub(r"^# (\w+ = )", r"\1", template, flags=re.MULTILINE)


def _plan(tmp_path: Path, algorithm: str = "fedstar", rounds: int = 7):
    """A parsed plan of three silos."""
    raw = {"federation": {"id": "kit-test", "algorithm": algorithm, "rounds": rounds,
                          "silos": ["hospital-a", "pharma-b", "lab-c"]}}
    return parse_plan(raw, base_dir=tmp_path)


def test_policy_template_as_shipped_is_empty_and_prefilled_accepts_only_its_plan(
        tmp_path: Path) -> None:
    for algorithm in ("fedstar", "gcfl", "local"):
        plan = _plan(tmp_path, algorithm).public
        template = policy_template("hospital-a", plan)
        shipped = tmp_path / f"{algorithm}-shipped.toml"
        shipped.write_text(template)
        assert tomllib.loads(template) == {"jobs": {}, "accept": {}, "privacy": {}}
        assert check_plan(load_policy(shipped), plan) == []
        assert load_policy(shipped).jobs.approve == "manual"     # every job held, as shipped
        filled = tmp_path / f"{algorithm}-filled.toml"
        filled.write_text(uncommented(template))
        policy = load_policy(filled)
        assert policy.algorithms == (algorithm,) and policy.max_rounds == 7
        assert check_plan(policy, plan) == []
        assert policy.jobs.plan_hashes == (plan.sha256(),)
        assert policy.jobs.approve == "manual" and policy.jobs.operators == (EXAMPLE_OPERATOR,)
        longer = _plan(tmp_path, algorithm, rounds=8).public
        assert [v.clause for v in check_plan(policy, longer)] == ["accept.max_rounds"]


def test_the_template_names_silo_serve_and_silo_join(tmp_path: Path) -> None:
    template = policy_template("hospital-a")
    assert "silo serve ... --policy policy.toml" in template
    assert "silo join ... --policy policy.toml" in template


def test_the_examples_need_a_real_plan_hash_and_are_otherwise_valid(tmp_path: Path) -> None:
    examples = tmp_path / "examples.toml"
    examples.write_text(uncommented(policy_template("hospital-a")))
    # The placeholder hash is refused by name: a made-up hash would refuse every job silently.
    with pytest.raises(PolicyError, match="jobs.plan_hashes") as refused:
        load_policy(examples)
    assert len(refused.value.problems) == 1
    examples.write_text("\n".join(line for line in examples.read_text().splitlines()
                                  if not line.startswith("plan_hashes")))
    policy = load_policy(examples)
    assert policy.algorithms == ("fedstar", "feddense")
    assert policy.privacy.required is True and policy.jobs.plan_hashes is None


def test_the_hash_of_a_job_plan_is_the_one_its_job_is_offered_under(tmp_path: Path) -> None:
    job = (b'[federation]\nid = "chem-study"\nalgorithm = "fedstar"\ndataset = "chem"\n'
           b'rounds = 3\nsilos = ["hospital-a", "pharma-b"]\n')
    plan_file = tmp_path / "job.toml"
    plan_file.write_bytes(job)
    public = load_plan(plan_file).public         # what `pki sign --kit --plan` reads
    assert public.sha256() == parse_job_plan(job).public.sha256()
    assert f'# plan_hashes = ["{public.sha256()}"]' in policy_template("hospital-a", public)


def test_a_private_plans_policy_template_asks_for_its_privacy(tmp_path: Path) -> None:
    private = replace(_plan(tmp_path, "fedstar").public, privacy=PrivacyConfig(
        mechanism="ddg", epsilon=4.0, noise_multiplier=1.2, design_graphs=100))
    filled = tmp_path / "private.toml"
    filled.write_text(uncommented(policy_template("hospital-a", private)))
    policy = load_policy(filled)
    assert policy.privacy.required and policy.privacy.max_epsilon == 4.0
    assert policy.privacy.mechanisms == ("ddg",)
    assert check_plan(policy, private) == []
    weaker = replace(private, privacy=replace(private.privacy, noise_multiplier=1.0))
    assert [v.clause for v in check_plan(policy, weaker)] == ["privacy.min_noise_multiplier"]
