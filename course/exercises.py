"""
The course's exercises, data only: the functions whose bodies a student writes, the lesson section, and the
tests that grade each (tests/conftest.py gives them the exercise's marker: `python -m pytest -m ex3`).

An exercise's tests call its own functions and no other a student writes, so that any one can be done alone:
where a function needs another exercise's, the test supplies a reference (ex7's hand rope_frequencies theta_i
and a YaRN ramp) or runs a scheme that needs none (ex6 and ex9 use pos="none"). To add an exercise: a row
below, its tests (property tests in tests/test_exercise_properties.py), a paragraph in docs/exercises.md.
"""

from dataclasses import dataclass

LESSON = "docs/lesson.md"
DIFFICULTIES = ("easy", "medium", "hard", "advanced")
PROPERTIES = "tests/test_exercise_properties.py"


@dataclass(frozen=True)
class Exercise:
    id: str  # "ex3": its pytest marker, and what --only names
    title: str  # one line, quoted by each stub's NotImplementedError
    functions: tuple[str, ...]  # "module:qualname" of each function whose body the student writes
    section: str  # the anchor of its section in docs/lesson.md
    # node ids that grade it, from the root: "file::test" (every parameter) or "file::test[p]"
    tests: tuple[str, ...]
    difficulty: str  # one of DIFFICULTIES
    minutes: int  # about how long it takes someone who has read the section
    hints: tuple[str, ...]  # one or two, for what the docstrings leave unsaid

    @property
    def number(self):
        return int(self.id.removeprefix("ex"))

    @property
    def stub_message(self):
        return f"exercise {self.number}: {self.title}; see {LESSON}#{self.section}"


def properties(*names):
    return tuple(f"{PROPERTIES}::{name}" for name in names)


# In teaching order: the tables, RoPE, ALiBi, the mask, the KV cache, context extension, then the instruments.
EXERCISES = (
    Exercise(
        id="ex1",
        title="the sinusoidal table",
        functions=("positions:sinusoidal_embedding",),
        section="3-additive-schemes-learned-and-sinusoidal",
        tests=(
            "tests/test_positions.py::test_sinusoidal_shift_is_one_linear_map_for_all_positions",
            "tests/test_positions.py::test_sinusoidal_wavelengths_for_gpt2_width",
            *properties(
                "test_sinusoidal_table_matches_its_formula_at_random_sizes",
                "test_sinusoidal_first_rows_worked_by_hand",
            ),
        ),
        difficulty="easy",
        minutes=15,
        hints=(
            "Column 2i holds sin(p w_i) and column 2i + 1 cos(p w_i): interleaved, not two halves.",
            "float64 is required, whatever dtype is asked for: compute the angles in float64, cast at "
            "the end. The tests compare a float64 table to 1e-12, a float32 one to 1e-6; angles p w_i "
            "computed in float32 are off by up to 1e-5 at p = 300, 3e-4 at p = 10^4 (lengths models "
            "reach).",
        ),
    ),
    Exercise(
        id="ex2",
        title="the learned table and its refusal past block_size",
        functions=("positions:LearnedPositions.reserve", "positions:LearnedPositions.embed"),
        section="3-additive-schemes-learned-and-sinusoidal",
        tests=(
            "tests/test_positions.py::test_learned_refuses_context_longer_than_block_size",
            *properties(
                "test_learned_reserve_refuses_only_past_block_size",
                "test_learned_embed_adds_the_rows_at_the_given_positions",
            ),
        ),
        difficulty="easy",
        minutes=10,
        hints=(
            "LearnedPositions is an nn.Embedding: its rows are self.weight, and super().forward(ids) looks "
            "them up.",
            "reserve raises ValueError('sequence length N exceeds block_size=T: pos=learned has no embedding "
            "past position T-1; sinusoidal, rope, alibi and none run longer'), the line the README quotes.",
        ),
    ),
    Exercise(
        id="ex3",
        title="RoPE: the frequencies and the rotation",
        functions=("positions:rope_inv_freq", "positions:rope_cos_sin", "positions:apply_rope"),
        section="4-rope-rotate-queries-and-keys-scores-depend-on-the-offset",
        tests=(
            "tests/test_positions.py::test_rope_toy_trace",
            *properties(
                "test_rope_inv_freq_is_base_to_the_minus_2i_over_d",
                "test_rope_cos_sin_turn_each_pair_by_position_times_theta",
                "test_apply_rope_turns_each_half_pair_by_plus_the_angle",
                "test_apply_rope_turns_only_the_first_d_dimensions",
                "test_apply_rope_worked_by_hand",
                "test_rope_scores_depend_only_on_the_offset_at_random_sizes",
            ),
        ),
        difficulty="medium",
        minutes=30,
        hints=(
            "Pairs are halves: dimension i turns with dimension i + d/2 (not 2i with 2i + 1), by +angle, as "
            "multiplying x_i + j x_(i+d/2) by e^(j angle) would.",
            "cos and sin are (T, d/2); they broadcast over the batch and head dimensions in front.",
        ),
    ),
    Exercise(
        id="ex4",
        title="ALiBi: the head slopes and the distance bias",
        functions=("positions:alibi_slopes", "positions:alibi_bias", "positions:alibi_bias_at"),
        section="5-alibi-a-distance-penalty-on-the-scores",
        tests=(
            "tests/test_positions.py::test_alibi_slopes_follow_press_et_al",
            "tests/test_positions.py::test_alibi_bias_is_minus_slope_times_distance",
            *properties(
                "test_alibi_slopes_at_random_head_counts",
                "test_alibi_bias_between_any_positions",
                "test_alibi_bias_puts_the_queries_last",
            ),
        ),
        difficulty="medium",
        minutes=25,
        hints=(
            "Head 0 gets the steepest slope, 2^(-8/n); the slopes fall from there.",
            "alibi_bias is alibi_bias_at with key positions 0 .. n_key - 1 and the last n_query as queries.",
        ),
    ),
    Exercise(
        id="ex5",
        title="the causal mask, with a window",
        functions=("positions:causal_mask",),
        section="2-the-causal-mask-is-not-a-position-encoding-but-it-is-a-little-one",
        tests=properties(
            "test_causal_mask_matches_its_definition_at_random_positions", "test_causal_mask_worked_by_hand"
        ),
        difficulty="easy",
        minutes=15,
        hints=(
            "Broadcast query_pos[:, None] against key_pos[None, :]; three conditions, each a bool tensor.",
        ),
    ),
    Exercise(
        id="ex6",
        title="the KV cache: positions past block_size",
        functions=("model:KVCache.update", "positions:cached_key_positions"),
        section="7-generating-past-the-trained-length",
        tests=properties(
            "test_kv_cache_hands_each_query_exactly_the_keys_it_may_see",
            "test_kv_cache_keeps_position_p_in_slot_p_mod_size",
            "test_decoding_one_token_at_a_time_matches_the_full_forward_past_block_size",
            "test_decoding_in_a_window_sees_only_the_latest_tokens",
        ),
        difficulty="hard",
        minutes=60,
        hints=(
            "update writes position p in slot p % size (slot p itself when the cache is no ring), with "
            "index_copy_ along the slot dimension, and returns the first n_keys slots: the mask says which a "
            "query sees.",
            "cached_key_positions: slot j holds the latest p < end with p % size == j; count back from "
            "end - 1 with the remainder (end - 1 - j) % size, and mark a negative p -1 (empty).",
        ),
    ),
    Exercise(
        id="ex7",
        title="RoPE context extension: linear, NTK and dynamic NTK",
        functions=("positions:rope_frequencies",),
        section="4-rope-rotate-queries-and-keys-scores-depend-on-the-offset",
        tests=properties(
            "test_rope_frequencies_at_factor_one_are_plain_rope",
            "test_linear_scaling_divides_theta_by_the_factor",
            "test_ntk_scaling_raises_the_base",
            "test_dynamic_ntk_follows_the_current_length",
            "test_yarn_blends_theta_by_its_ramp_and_scales_attention",
            "test_rope_frequencies_refuse_what_they_cannot_extend",
        ),
        difficulty="medium",
        minutes=25,
        hints=(
            "Start from rope_inv_freq(d, base): NTK and dynamic NTK change the base they hand it.",
            "Raise ValueError for an unknown scaling, a factor below 1, dynamic without original_len and "
            "seq_len, yarn without original_len. Return float32 frequencies and the attention scale.",
        ),
    ),
    Exercise(
        id="ex8",
        title="the YaRN ramp (advanced)",
        functions=("positions:yarn_ramp",),
        section="14-past-the-trained-length-popular-claims-against-our-numbers",
        tests=properties(
            "test_yarn_ramp_worked_by_hand", "test_yarn_ramp_keeps_fast_pairs_and_moves_slow_ones"
        ),
        difficulty="advanced",
        minutes=30,
        hints=(
            "The ramp is linear in the pair index i, between the (real) indices of the pairs turning "
            "beta_fast and beta_slow times over original_len, rounded out with floor and ceil.",
        ),
    ),
    Exercise(
        id="ex9",
        title="the permutation-equivariance measure",
        functions=("measure.instruments:swap_permutation", "measure.instruments:swap_differences"),
        section="12-who-bit-whom-a-live-demonstration",
        tests=(
            "tests/test_demo.py::"
            "test_without_positions_or_mask_the_swapped_sentence_gives_the_same_states_up_to_the_swap",
            "tests/test_demo.py::test_the_causal_mask_alone_tells_the_swapped_sentences_apart",
            *properties(
                "test_swap_permutation_puts_the_last_piece_first_at_random_sizes",
                "test_swap_differences_is_the_largest_gap_up_to_the_permutation",
            ),
        ),
        difficulty="medium",
        minutes=25,
        hints=(
            "Token i of the original sits at position argsort(perm)[i] of the permuted run.",
            "hidden_states gives the embedding output and each block's: one (words, rest) pair per state.",
        ),
    ),
    Exercise(
        id="ex10",
        title="the position probe",
        functions=(
            "measure.instruments:probe_targets",
            "measure.instruments:fit_ridge",
            "measure.instruments:r_squared",
        ),
        section="13-where-does-position-live-a-probe",
        tests=(
            "tests/test_demo.py::test_probe_targets_count_back_to_the_latest_newline",
            "tests/test_demo.py::test_without_the_mask_nope_hidden_states_hold_no_position",
            *properties(
                "test_probe_targets_match_a_loop_at_random_windows",
                "test_fit_ridge_solves_the_centred_normal_equations",
                "test_r_squared_worked_by_hand",
            ),
        ),
        difficulty="medium",
        minutes=30,
        hints=(
            "fit_ridge's penalty is ridge times the mean of the diagonal of Xc^T Xc (Xc: X minus its column "
            "means), so it does not depend on the features' scale; the intercept is not penalised.",
            "r_squared is 1 - sum (y - prediction)^2 / sum (y - mean y)^2, as a Python float; cummax finds "
            "the latest newline.",
        ),
    ),
)


def by_id():
    return {exercise.id: exercise for exercise in EXERCISES}
