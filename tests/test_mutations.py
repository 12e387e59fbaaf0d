"""Mutation checks: each named break of the product must make the test that guards it fail.

A mutation is a textual patch of one product file (`old` -> `new`, `old` found exactly once) applied to a copy of
the repository in a temp folder; the guarding test node then runs there in a fresh pytest (PYTHONPATH on the copy,
so processes it starts import the mutant too) and must fail (exit 1). A mutation that survives, an anchor that is
gone or found twice, a node that is skipped or missing: each fails here, naming the mutation.

When the product changes under a mutation, its `old` no longer matches: rewrite the mutation against the new code
(the same break, the same guarding test), never drop it.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NODE_TIMEOUT_S = 300
COPY_IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".pytest_cache", "*.pyc")


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    path: str      # product file, relative to the repository root
    old: str       # found exactly once in it
    new: str
    node: str      # the test that must fail on the mutant


MUTATIONS = (
    Mutation("critic values never reach GAE", "jaxwebrl/train/update.py",
             'extra["values"] = values', "pass",
             "tests/train/test_critic.py::test_the_policy_step_follows_the_critics_values"),
    Mutation("1/k normaliser replaced by 1/|tau|", "jaxwebrl/rl/advantages.py",
             'denom = jnp.full_like(table["steps"], float(const_length))', 'denom = table["steps"]',
             "tests/rl/test_advantages.py::test_const_length_vs_episode_length"),
    Mutation("behaviour-cap drop off", "jaxwebrl/rl/rejection.py",
             "dropped = loss_mask & (w > cap)", "dropped = loss_mask & (w > jnp.inf)",
             "tests/rl/test_losses.py::test_behaviour_weight_and_dropping_cap_keep_denominator"),
    Mutation("decoupled behaviour weight always 1", "jaxwebrl/rl/rejection.py",
             "    w = jnp.exp(log_w)\n", "    w = jnp.ones_like(log_w)\n",
             "tests/rl/test_losses.py::test_behaviour_weight_and_dropping_cap_keep_denominator"),
    Mutation("reference KL rewarded instead of penalised", "jaxwebrl/rl/advantages.py",
             "-kl_ctl * kl, 0.0)", "kl_ctl * kl, 0.0)",
             "tests/rl/test_advantages.py::test_kl_in_reward_k1_k2_k3"),
    Mutation("staleness filter off", "jaxwebrl/train/gatherer.py",
             "elif staleness(episode, current_version) > self.max_head_offpolicyness:", "elif False:",
             "tests/train/test_gatherer.py::test_groups_filtered_and_batched_whole"),
    Mutation("buffer rows' checksum not checked", "jaxwebrl/buffer/integrity.py",
             'if not np.array_equal(row_checksums(rows, config), rows["checksum"]):', "if False:",
             "tests/buffer/test_integrity.py::test_one_flipped_byte_in_a_row_with_its_stamp_intact_is_corrupt"),
    Mutation("checkpoint leaf digests not checked at restore", "jaxwebrl/checkpoint/layout.py",
             "    if DIGESTS_ITEM in restored.keys():", "    if False:",
             "tests/train/test_checkpoint_faults.py::"
             "test_a_bit_flip_inside_a_saved_array_makes_resume_fall_back_naming_the_leaf"),
    Mutation("checkpoint digest blind to where an element sits", "jaxwebrl/checkpoint/digests.py",
             "_mix(words + index * jnp.uint32(step), finaliser) for", "_mix(words, finaliser) for",
             "tests/checkpoint/test_digests.py::"
             "test_a_flipped_bit_swapped_elements_a_zeroed_block_or_a_shard_in_anothers_place_is_damage"),
    Mutation("checkpoint digest the linear pair sum(w), sum((i + 1) * w) instead of mixed terms",
             "jaxwebrl/checkpoint/digests.py",
             "_mix(words + index * jnp.uint32(step), finaliser) for",
             "(words * (index + 1) if step == LANES[0][0] else words) for",
             "tests/checkpoint/test_digests.py::"
             "test_a_flipped_bit_swapped_elements_a_zeroed_block_or_a_shard_in_anothers_place_is_damage"),
    Mutation("an unfinished buffer creation is recognised by its marker alone", "jaxwebrl/buffer/ring.py",
             "return CREATING_KEY in names and names <= CREATION_KEYS", "return CREATING_KEY in names",
             "tests/buffer/test_from_config.py::test_a_buffer_with_committed_episodes_is_never_created_again"),
    Mutation("decoded tokens stamped with version 0", "jaxwebrl/models/sampler.py",
             "versions=put(state.versions, jnp.where(live, version, -1)),",
             "versions=put(state.versions, jnp.where(live, 0, -1)),",
             "tests/models/test_sampler.py::test_weight_swap_between_chunks_records_versions"),
    Mutation("engine judge's verdicts decoded without their grammar", "jaxwebrl/rollout/policy_server.py",
             "seed=seeds, constraint=verdict)", "seed=seeds, constraint=None)",
             "tests/rollout/test_engine_judge.py::"
             "test_every_verdict_parses_its_criteria_make_the_reward_and_no_policy_token_is_counted"),
    Mutation("a group handed out with more than its G members", "jaxwebrl/buffer/ring.py",
             "groups = [members[:group_size] for members", "groups = [members for members",
             "tests/buffer/test_ring.py::test_a_group_is_never_handed_out_with_more_than_its_size"),
    Mutation("transport admits any PLAIN password", "jaxwebrl/rollout/transport.py",
             "and hmac.compare_digest(credentials[1], self._token))", "and True)",
             "tests/rollout/test_transport.py::test_wrong_token_is_refused_and_the_server_goes_on"),
    Mutation("a resumed trainer publishes a version its crash lost again", "jaxwebrl/train/versions.py",
             "return max(int(version), self.published) + 1", "return int(version) + 1",
             "tests/train/test_versions.py::test_versions_published_after_the_checkpoint_are_never_published_again"),
    Mutation("an episode of a lost version trained as fresh", "jaxwebrl/train/gatherer.py",
             "elif self.lost_versions(episode):", "elif False:",
             "tests/train/test_gatherer.py::"
             "test_an_episode_of_weights_a_crash_lost_is_dropped_as_stale_not_trained_as_fresh"),
    Mutation("each trainer process decides on its own which partial groups wait", "jaxwebrl/buffer/ring.py",
             "if held_back is not None:", "if False:",
             "tests/scale/test_multihost_layout.py::"
             "test_every_process_holds_back_the_partial_groups_process_0_holds_back"),
    Mutation("a request its client gave up on waits on for admission", "jaxwebrl/rollout/admission.py",
             "if self._requests[worker_id] != ticket:", "if False:",
             "tests/rollout/test_admission.py::test_a_request_its_client_gave_up_on_leaves_when_the_worker_asks_again"),
)


def mutant_tree(mutation: Mutation, where: pathlib.Path) -> pathlib.Path:
    """A copy of the repository at `where` with `mutation` applied; ValueError when its anchor is not unique."""
    source = (ROOT / mutation.path).read_text()
    found = source.count(mutation.old)
    if found != 1:
        raise ValueError(f"mutation {mutation.name!r}: {mutation.old!r} is found {found} times in {mutation.path} "
                         f"(once expected): rewrite it against the current code in tests/test_mutations.py")
    tree = where / "repo"
    shutil.copytree(ROOT, tree, ignore=COPY_IGNORE, symlinks=True)
    (tree / mutation.path).write_text(source.replace(mutation.old, mutation.new))
    return tree


def run_node(tree: pathlib.Path, node: str) -> subprocess.CompletedProcess:
    """`node` in a fresh pytest inside `tree` (its own package first on every path, no cache written)."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist",
                           f"--timeout={NODE_TIMEOUT_S}", "-W", "ignore", node],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=NODE_TIMEOUT_S + 60)


@pytest.mark.slow   # a fresh JAX process and one product test per mutation: 4-60 s each on a busy 2-core box
@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_the_mutation_is_killed_by_its_test(mutation, tmp_path):
    tree = mutant_tree(mutation, tmp_path)
    done = run_node(tree, mutation.node)
    tail = (done.stdout + done.stderr)[-3000:]
    assert done.returncode != 0, f"mutation {mutation.name!r} survived: {mutation.node} passed on it\n{tail}"
    assert done.returncode == 1 and " failed" in done.stdout, (
        f"mutation {mutation.name!r}: {mutation.node} did not run to a failure (exit {done.returncode}: "
        f"missing, skipped or a collection error)\n{tail}")


def test_a_mutant_tree_holds_the_mutation_and_the_original_is_untouched(tmp_path):
    mutation = MUTATIONS[1]
    before = (ROOT / mutation.path).read_text()
    tree = mutant_tree(mutation, tmp_path)
    assert mutation.new in (tree / mutation.path).read_text() and mutation.old not in (tree / mutation.path).read_text()
    assert (ROOT / mutation.path).read_text() == before
    with pytest.raises(ValueError, match="found 0 times"):
        mutant_tree(dataclasses.replace(mutation, old="no such text anywhere"), tmp_path / "again")
