"""The policy template of a silo's onboarding kit: every clause of a silo policy, commented out.

The silo reads the file with `silo serve --policy` (and `silo join --policy`); its clauses are
those of silo/privacy/policy.py, dp_policy.py and jobs_policy.py (docs/configuration.md, "The
silo policy"). Given the plan the kit is made for, each clause holds that plan's value, so that
uncommenting them all accepts exactly plans like it.
"""

from __future__ import annotations

from trellis.protos.algorithms import algorithm
from trellis.protos.plan import PublicPlan

# What an operator certificate subject looks like in the [jobs] example: set it to the names
# of the consortium's operators (`coordinator pki operator --name`).
EXAMPLE_OPERATOR = "ops-alice"
# Without a plan there is no hash to give: a placeholder that `silo serve` refuses, by name,
# if it is uncommented as it stands.
HASH_PLACEHOLDER = "<64 hex digits: the public plan's SHA-256>"


def policy_template(name: str, plan: PublicPlan | None = None) -> str:
    """A policy file with every clause commented out (as shipped it accepts any plan).

    With a plan, each clause holds that plan's value, so uncommenting them all accepts exactly
    plans like it (same algorithm, no more rounds, the same shared tensors and thresholds; as a
    job, only that very plan, held for `silo jobs approve`).
    """
    if plan is None:
        head = ("# The values below are examples; set your own before uncommenting.\n")
        values = {
            "algorithms": '["fedstar", "feddense"]', "max_rounds": "200",
            "shared_tensors": '["embedding_s", "graph_convs_s_gcn"]',
            "min_aggregate_silos": "3", "min_threshold": "3", "ring_bits": "[64]",
            "reveal_unweighted_sum": "false", "reveal_update_norms": "false"}
    else:
        row = algorithm(plan.algorithm)
        fewest = 2 if row.clustered else plan.aggregation.threshold
        head = (f"# The values below are those of the plan of federation {plan.federation} "
                f"({plan.algorithm},\n# {plan.rounds} rounds): uncommenting them all accepts "
                "that plan and refuses one that asks for\n# more.\n")
        values = {
            "algorithms": f'["{plan.algorithm}"]', "max_rounds": str(plan.rounds),
            "shared_tensors": "[" + ", ".join(f'"{g}"' for g in row.shares) + "]",
            "min_aggregate_silos": str(max(fewest, 1)), "min_threshold": str(max(fewest, 1)),
            "ring_bits": f"[{plan.aggregation.ring_bits}]",
            "reveal_unweighted_sum": str(plan.aggregation.unweighted_sum).lower(),
            "reveal_update_norms": str(row.clustered).lower()}
    notes = {
        "algorithms": "algorithms this silo takes part in",
        "max_rounds": "most rounds it trains for",
        "shared_tensors": "parameter groups that may leave it, masked",
        "min_aggregate_silos": "fewest silos in any unmasked sum",
        "min_threshold": "least secure-aggregation threshold",
        "ring_bits": "accepted ring sizes, out of 32 and 64",
        "reveal_unweighted_sum": "false refuses GCFL's plain unweighted cluster sum",
        "reveal_update_norms": "false refuses GCFL and GCFL+, which send per-silo norms in plain",
    }
    lines = [f"#   {notes[clause]}:\n# {clause} = {values[clause]}" for clause in notes]
    return (f"# Policy of silo {name}: which jobs and plans it takes part in.\n"
            "# Use it with: silo serve ... --policy policy.toml (a standing silo), or\n"
            "#               silo join ... --policy policy.toml (one experiment).\n"
            "# Every clause is optional and commented out: as shipped, this file accepts any\n"
            "# plan, and `silo serve` holds each acceptable job offer for you to approve. Remove\n"
            "# the leading '# ' of a clause to enforce it; a plan that breaks one is refused\n"
            "# before anything leaves the silo (`silo join`: exit 2).\n"
            + head + _jobs_clauses(plan) + "\n[accept]\n" + "\n".join(lines) + "\n"
            + _privacy_clauses(plan))


def _jobs_clauses(plan: PublicPlan | None) -> str:
    """The policy's [jobs] table, commented out (silo/privacy/jobs_policy.py): `approve` at its
    default, an example operator, and the plan's own hash where there is a plan."""
    digest = HASH_PLACEHOLDER if plan is None else plan.sha256()
    return ("\n# Job offers (`silo serve` only): whose signed jobs count and whether an "
            "acceptable one runs\n# at once. Checked before the [accept] and [privacy] "
            "clauses below.\n[jobs]\n"
            "#   \"manual\" (the default): an acceptable job waits for `silo jobs approve ID`"
            "\n#   (or `silo jobs refuse ID --reason ...`); \"auto\": it runs at once:\n"
            "# approve = \"manual\"\n"
            "#   operator certificate subjects whose signed jobs count (absent: any operator "
            "of the\n#   federation's CA); the name is an example, give your consortium's "
            "operators:\n"
            f"# operators = [\"{EXAMPLE_OPERATOR}\"]\n"
            "#   the public plans allowed, by SHA-256 (`silo jobs show` prints it; absent: any "
            "plan the\n#   other clauses accept)" + ("" if plan is None else ": this plan's")
            + f":\n# plan_hashes = [\"{digest}\"]\n")


def _privacy_clauses(plan: PublicPlan | None) -> str:
    """The policy's [privacy] table, commented out: the plan's own values where it has them, so
    that uncommenting them all accepts it (silo/privacy/dp_policy.py)."""
    p = None if plan is None else plan.privacy
    if p is None or not p.enabled:
        values = {"required": "false" if plan is not None else "true", "max_epsilon": "8.0",
                  "max_delta": "1e-5", "min_noise_multiplier": "0.8", "min_colluders": "1",
                  "min_threshold": "3", "max_clip": "1.0", "max_rounds": "500",
                  "unit": '"record"', "mechanisms": '["ddg", "local-gaussian"]'}
    else:
        assert plan is not None
        values = {"required": "true", "max_epsilon": f"{p.epsilon:g}" if p.epsilon else "8.0",
                  "max_delta": f"{p.delta:g}", "min_noise_multiplier": f"{p.noise_multiplier:g}",
                  "min_colluders": str(p.colluders),
                  "min_threshold": str(plan.aggregation.threshold), "max_clip": f"{p.clip:g}",
                  "max_rounds": str(plan.rounds), "unit": f'"{p.unit}"',
                  "mechanisms": f'["{p.mechanism}"]'}
    notes = {
        "required": "true refuses plans without differential privacy",
        "max_epsilon": "the most epsilon this silo spends on its own graphs in the federation",
        "max_delta": "the largest delta (keep it below 1 / your number of training graphs)",
        "min_noise_multiplier": "the least noise multiplier z of every unmasked sum",
        "min_colluders": "silos the plan must assume collude with the coordinator",
        "min_threshold": "least secure-aggregation threshold the noise is calibrated to",
        "max_clip": "largest clip norm of one graph's (or one silo's) contribution",
        "max_rounds": "most private rounds", "unit": "\"record\" (one graph) or \"silo\"",
        "mechanisms": "accepted mechanisms",
    }
    lines = [f"#   {notes[clause]}:\n# {clause} = {values[clause]}" for clause in notes]
    return ("\n# Differential privacy (docs/privacy.md): what this silo demands of the plan's "
            "[privacy] table.\n# Adding on_exhausted = \"stop\" joins a plan whose whole run "
            "would exceed max_epsilon and\n# leaves before the first round that could; by "
            "default such a plan is refused on joining.\n[privacy]\n" + "\n".join(lines) + "\n")
