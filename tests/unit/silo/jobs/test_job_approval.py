"""Deciding a job offer (silo/jobs/approval.py): every check, with real certificates and real
signed statements, and no bad input that escapes as an exception."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.certs import foreign_identity
from tests.support.jobs import DATASET, PLAN_FILE, JobFederation, public_plan, signed_offer
from trellis.crypto.pki import Identity, load_identity
from trellis.crypto.revocation import certificate_serial, load_crl, revoke
from trellis.protos.submission import new_submission, sign_submission
from trellis.silo.jobs.approval import Decision, Offer, evaluate_offer
from trellis.silo.privacy.jobs_policy import JobsPolicy
from trellis.silo.privacy.policy import Policy

DATASETS = {DATASET: Path("/data/molecules"), "proteins": Path("/data/proteins")}
AUTO = Policy(jobs=JobsPolicy(approve="auto"))


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> JobFederation:
    return JobFederation.create(tmp_path_factory.mktemp("job-approval"))


@pytest.fixture(scope="module")
def alice(federation: JobFederation) -> Identity:
    return federation.operator("alice")


@pytest.fixture(scope="module")
def bob(federation: JobFederation) -> Identity:
    return federation.operator("bob")


def _evaluate(federation: JobFederation, offer: Offer, policy: Policy | None = AUTO,
              **options: object) -> Decision:
    return evaluate_offer(offer, policy=policy, ca_pem=federation.ca_pem, datasets=DATASETS,
                          **options)  # type: ignore[arg-type]


def _refused(decision: Decision, *fragments: str) -> None:
    assert decision.verdict == "refuse", decision
    for fragment in fragments:
        assert fragment in decision.reason, decision.reason
    assert "\n" not in decision.reason


def test_a_good_offer_is_approved_under_auto(federation: JobFederation, alice: Identity
                                              ) -> None:
    offer = signed_offer(alice)
    decision = _evaluate(federation, offer)
    assert decision.verdict == "approve"
    assert decision.reason == 'policy approves it (jobs.approve = "auto")'
    assert decision.plan == public_plan()
    assert decision.submission is not None and decision.submission.operator == "alice"


@pytest.mark.parametrize("policy", [None, Policy(), Policy(jobs=JobsPolicy(approve="manual"))])
def test_a_good_offer_is_held_for_the_operator_by_default(
        federation: JobFederation, alice: Identity, policy: Policy | None) -> None:
    decision = _evaluate(federation, signed_offer(alice, job_id=3), policy)
    assert (decision.verdict, decision.reason) == ("hold", "awaiting `silo jobs approve 3`")
    assert decision.plan is not None and decision.submission is not None


@pytest.mark.parametrize(("statement", "fragment"), [
    ("", "the operator's statement does not parse: job statement is not JSON"),
    ("[]", "job statement: expected the fields nonce, operator, plan_sha256"),
    ('{"a": 1}', "expected the fields"),
    ("[" * 100_000, "the operator's statement does not parse"),
])
def test_a_statement_that_does_not_parse_is_refused(
        federation: JobFederation, alice: Identity, statement: str, fragment: str) -> None:
    offer = replace(signed_offer(alice), submission_json=statement)
    decision = _evaluate(federation, offer)
    _refused(decision, fragment)
    assert decision.plan is None and decision.submission is None


def test_a_statement_not_in_canonical_form_is_refused(federation: JobFederation,
                                                      alice: Identity) -> None:
    offer = signed_offer(alice)
    spaced = offer.submission_json.replace(",", ", ")
    _refused(_evaluate(federation, replace(offer, submission_json=spaced)),
             "job statement is not in canonical form")


@pytest.mark.parametrize(("plan_json", "fragment"), [
    ("not json", "the public plan does not parse: public plan is not valid JSON"),
    ("[]", "the public plan does not parse: public plan: must be an object"),
    ('{"federation": "demo"}', "algorithm: None is not an algorithm"),
    ("[" * 100_000, "the public plan does not parse: it is nested too deeply"),
])
def test_a_plan_that_does_not_parse_is_refused_with_its_problems(
        federation: JobFederation, alice: Identity, plan_json: str, fragment: str) -> None:
    offer = replace(signed_offer(alice), public_plan_json=plan_json)
    decision = _evaluate(federation, offer)
    _refused(decision, fragment)
    assert decision.plan is None


def test_a_plan_other_than_the_one_signed_is_refused(federation: JobFederation,
                                                     alice: Identity) -> None:
    signed = signed_offer(alice)
    swapped = replace(signed, public_plan_json=public_plan(rounds=500).to_json())
    decision = _evaluate(federation, swapped)
    _refused(decision, "the plan offered is not the plan the operator signed",
             f"the statement names {public_plan().sha256()[:12]}…")
    assert decision.plan == public_plan(rounds=500) and decision.submission is None


def test_a_certificate_of_another_federation_is_refused(
        federation: JobFederation, tmp_path: Path) -> None:
    stranger = load_identity(foreign_identity(tmp_path, "alice", federation="other"))
    _refused(_evaluate(federation, signed_offer(stranger)),
             "the certificate offered for operator 'alice': it was issued by 'other "
             "federation CA', not by this federation's CA 'demo federation CA'")


def test_an_expired_certificate_is_refused_saying_so(federation: JobFederation,
                                                     alice: Identity) -> None:
    later = datetime.now(UTC) + timedelta(days=400)
    _refused(_evaluate(federation, signed_offer(alice), now=later),
             "the certificate offered for operator 'alice': it expired on")


def test_a_silo_certificate_cannot_submit_jobs(federation: JobFederation) -> None:
    silo = federation.silo("lab-a")
    _refused(_evaluate(federation, signed_offer(silo)),
             "the certificate offered for operator 'lab-a' is that of 'lab-a', not an "
             "operator certificate")


def test_a_statement_naming_another_operator_is_refused(federation: JobFederation,
                                                        alice: Identity) -> None:
    plan = public_plan()
    statement = new_submission(plan.sha256(), PLAN_FILE, "bob")
    offer = signed_offer(alice, plan, submission=statement)
    _refused(_evaluate(federation, offer),
             "the statement names operator 'bob' but comes with the certificate of 'alice'")


def test_a_revoked_operator_is_refused(federation: JobFederation) -> None:
    carol = federation.operator("carol")
    revoke(federation.ca_dir, {certificate_serial(carol.cert_pem)})
    crl = load_crl((federation.ca_dir / "crl.pem").read_bytes(), federation.ca_pem)

    def revoked(cert_pem: bytes) -> bool:
        return crl.revoked_at(certificate_serial(cert_pem)) is not None

    _refused(_evaluate(federation, signed_offer(carol), revoked=revoked),
             "the certificate of operator 'carol' is revoked by the federation's CRL")
    assert _evaluate(federation, signed_offer(federation.operator("dave")),
                     revoked=revoked).verdict == "approve"


def test_a_signature_that_does_not_verify_is_refused(federation: JobFederation,
                                                     alice: Identity, bob: Identity) -> None:
    offer = signed_offer(alice)
    statement = new_submission(public_plan().sha256(), PLAN_FILE, "alice")
    for signature in (b"", b"\x30" * 70, sign_submission(bob.key_pem, statement),
                      sign_submission(alice.key_pem, statement)):   # over another statement
        decision = _evaluate(federation, replace(offer, signature=signature))
        _refused(decision, "the signature of operator 'alice' does not verify over the "
                           "statement offered")
        assert decision.submission is None      # an unverified statement is never "seen"


def test_an_operator_the_policy_does_not_list_is_refused(
        federation: JobFederation, alice: Identity, bob: Identity) -> None:
    policy = Policy(jobs=JobsPolicy(approve="auto", operators=("alice",)), source="p.toml")
    assert _evaluate(federation, signed_offer(alice), policy).verdict == "approve"
    _refused(_evaluate(federation, signed_offer(bob), policy),
             "p.toml does not take jobs from operator 'bob' (jobs.operators: alice)")


def test_a_submission_replayed_as_another_job_is_refused(federation: JobFederation,
                                                         alice: Identity) -> None:
    offer = signed_offer(alice, job_id=5)
    first = _evaluate(federation, offer)
    assert first.submission is not None
    seen = {first.submission.sha256: 4}
    decision = _evaluate(federation, offer, seen=seen.get)
    _refused(decision, "the signed submission of job 4, offered again as job 5")
    # The same job offered again (a coordinator that restarted) is no replay.
    again = _evaluate(federation, replace(offer, job_id=4), seen=seen.get)
    assert again.verdict == "approve"


def test_a_plan_the_policy_does_not_list_is_refused(federation: JobFederation,
                                                    alice: Identity) -> None:
    listed = public_plan().sha256()
    policy = Policy(jobs=JobsPolicy(approve="auto", plan_hashes=(listed,)))
    assert _evaluate(federation, signed_offer(alice), policy).verdict == "approve"
    other = public_plan(rounds=20)
    _refused(_evaluate(federation, signed_offer(alice, other), policy),
             f"policy does not list this plan (SHA-256 {other.sha256()}) in jobs.plan_hashes")


@pytest.mark.parametrize(("dataset", "datasets", "fragment"), [
    ("", DATASETS, "the plan names no dataset (federation.dataset); a standing silo trains "
                   "only on a dataset it serves (it serves: molecules, proteins)"),
    ("cora", DATASETS, "this silo holds no dataset named 'cora' (it serves: molecules, "
                       "proteins)"),
    (DATASET, {}, "this silo holds no dataset named 'molecules' (it serves none)"),
])
def test_a_dataset_this_silo_does_not_serve_is_refused(
        federation: JobFederation, alice: Identity, dataset: str,
        datasets: dict[str, Path], fragment: str) -> None:
    offer = signed_offer(alice, public_plan(dataset=dataset))
    decision = evaluate_offer(offer, policy=AUTO, ca_pem=federation.ca_pem, datasets=datasets)
    _refused(decision, fragment)
    assert decision.submission is not None    # signed all the same: a replay is still a replay


def test_a_plan_that_breaks_the_policy_is_refused_listing_every_clause(
        federation: JobFederation, alice: Identity) -> None:
    policy = Policy(algorithms=("feddense",), max_rounds=5, source="p.toml",
                    jobs=JobsPolicy(approve="auto"))
    _refused(_evaluate(federation, signed_offer(alice), policy),
             "p.toml refuses the plan: accept.algorithms allows feddense, the plan asks "
             "fedstar; accept.max_rounds allows at most 5, the plan asks 10 rounds")


def test_the_checks_run_in_order(federation: JobFederation, alice: Identity,
                                 bob: Identity) -> None:
    # Broken twice over: the operator is not listed and the plan breaks the policy; the
    # operator's clause comes first.
    policy = Policy(max_rounds=5, jobs=JobsPolicy(approve="auto", operators=("bob",)))
    _refused(_evaluate(federation, signed_offer(alice), policy), "jobs.operators")


@settings(max_examples=60, deadline=None)
@given(statement=st.text(max_size=200), plan_json=st.text(max_size=200),
       signature=st.binary(max_size=80), certificate=st.binary(max_size=200),
       job_id=st.integers())
def test_no_bad_input_escapes_as_an_exception(statement: str, plan_json: str,
                                              signature: bytes, certificate: bytes,
                                              job_id: int) -> None:
    offer = Offer(job_id=job_id, federation="demo", public_plan_json=plan_json,
                  submission_json=statement, signature=signature,
                  operator_certificate_pem=certificate)
    decision = evaluate_offer(offer, policy=None, ca_pem=b"not a CA", datasets={})
    assert decision.verdict == "refuse" and decision.reason and "\n" not in decision.reason


@pytest.mark.parametrize(("certificate", "why"), [
    (b"", "it is not a PEM X.509 certificate"),
    (b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
     "it is not a PEM X.509 certificate"),
    (None, "it is the federation CA's own certificate, not an operator's"),
])
def test_a_certificate_that_is_no_operators_is_refused_saying_what_it_is(
        federation: JobFederation, alice: Identity, certificate: bytes | None, why: str) -> None:
    pem = federation.ca_pem if certificate is None else certificate
    offer = replace(signed_offer(alice), operator_certificate_pem=pem)
    _refused(_evaluate(federation, offer), f"the certificate offered for operator 'alice': {why}")


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from(["public_plan_json", "signature", "operator_certificate_pem"]),
       text=st.text(max_size=300), data=st.binary(max_size=300))
def test_no_bad_field_of_a_signed_offer_escapes_as_an_exception(
        federation: JobFederation, alice: Identity, field: str, text: str, data: bytes) -> None:
    offer = replace(signed_offer(alice), **{field: text if field == "public_plan_json" else data})
    decision = _evaluate(federation, offer)
    assert decision.verdict == "refuse" and decision.reason and "\n" not in decision.reason


def test_a_plan_naming_an_initial_model_the_silo_does_not_hold_is_refused(
        federation: JobFederation, alice: Identity) -> None:
    wanted = "ab" * 32
    plan = public_plan(model=replace(public_plan().model, init_sha256=wanted))
    offer = signed_offer(alice, plan, job_id=41)
    _refused(_evaluate(federation, offer, init_models={"cd" * 32: Path("/models/other.pt")}),
             f"the plan starts from the initial model {wanted} ([model] init_sha256), and this "
             "silo holds none with that SHA-256 (1 in its --init-models folder)")
    _refused(_evaluate(federation, offer), "holds none with that SHA-256 (0 in")
    held = _evaluate(federation, offer, init_models={wanted: Path("/models/init.pt")})
    assert held.verdict == "approve", held.reason
