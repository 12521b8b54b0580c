"""The step costs a worker reports for the spec gate are measured while it
serves (worker/spec/live_step_costs.h): after speculative rounds of k = 3 the
4-column round cost and the batch-1 decode cost are what those passes took,
not the start-up probe's, and the table stays complete; a worker given
--step_costs reports exactly those. Requests stay exact either way."""
import e2e_util as u


def _costs(cluster):
    c = cluster.worker_info(0).costs
    return list(c.decode_seconds_by_batch), list(c.verify_seconds_by_columns)


def _spec_turn(c, prompt, n=24):
    return u.generate_ok(c, {
        "token_ids": {"ids": prompt}, "stopping": {"max_tokens": n,
                                                   "ignore_eos": True},
        "speculation": {"enable": True, "k": 3}, "response": {"ids": True}})


def test_costs_follow_what_the_worker_ran():
    cluster = u.Cluster(n_workers=1)
    try:
        c = cluster.client
        decode0, rounds0 = _costs(cluster)
        assert len(decode0) >= 1 and len(rounds0) >= 4
        prompt = u.prompt_ids(7)
        r = _spec_turn(c, prompt)
        u.assert_matches_reference(prompt, r, 24, ignore_eos=True)
        plain = u.generate_ok(c, {
            "token_ids": {"ids": prompt}, "stopping": {"max_tokens": 8,
                                                       "ignore_eos": True},
            "response": {"ids": True}})
        assert list(plain.ids) == list(r.ids)[:8]
        decode1, rounds1 = _costs(cluster)
        # Same shape (at least), every entry a positive time.
        assert len(decode1) >= len(decode0) and len(rounds1) >= len(rounds0)
        assert all(x > 0 for x in decode1 + rounds1)
        # The rows these requests ran were re-measured.
        assert decode1[0] != decode0[0]
        assert rounds1[3] != rounds0[3]
    finally:
        cluster.stop()


def test_fixed_step_costs_are_reported_as_given():
    costs = "--step_costs=decode=0.0100,0.0101;verify=0.0105,0.0105,0.0105,0.0105"
    cluster = u.Cluster(n_workers=1, worker_extra=[costs])
    try:
        prompt = u.prompt_ids(8)
        r = _spec_turn(cluster.client, prompt)
        u.assert_matches_reference(prompt, r, 24, ignore_eos=True)
        decode, rounds = _costs(cluster)
        assert decode == [0.0100, 0.0101]
        assert rounds == [0.0105] * 4
    finally:
        cluster.stop()
