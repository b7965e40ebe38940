import json
import time

import pytest

from pipeline.collect import bounded, grading
from pipeline.collect.grading import GRADERS, extract_answer, grade, is_empty, literal_equal, math_equal, normalize_math
from pipeline.core.errors import RouterLiteError
from pipeline.core.prompts import LETTERS, mcq_prompt


# ------------------------------------------------------------------------------------------------- is_empty
@pytest.mark.parametrize("text", [None, "", "   ", "\n\t "])
def test_is_empty(text):
    assert is_empty(text)


def test_not_empty():
    assert not is_empty(" 0 ")


@pytest.mark.parametrize("grader", GRADERS)
@pytest.mark.parametrize("text", [None, "", "  \n"])
def test_empty_reply_is_never_correct(text, grader):
    assert grade(text, "", grader) == (None, False)
    assert grade(text, "A", grader) == (None, False)


def test_unknown_grader_names_it():
    with pytest.raises(RouterLiteError, match="exact_match"):
        extract_answer("The answer is 3", "exact_match")
    with pytest.raises(RouterLiteError, match="exact_match"):
        grade("", "3", "exact_match")
    assert issubclass(RouterLiteError, ValueError)


# ------------------------------------------------------------------------------------------------ extraction
def test_nested_boxed():
    text = r"So $\cos 45^\circ = \boxed{\frac{1}{\sqrt{2}}}$."
    assert extract_answer(text, "math_expression") == r"\frac{1}{\sqrt{2}}"


def test_last_boxed_wins_and_fbox():
    text = r"First guess \boxed{3}, but correcting: \fbox{\dfrac{7}{2}}"
    assert extract_answer(text, "math_expression") == r"\dfrac{7}{2}"


def test_boxed_without_braces():
    assert extract_answer(r"hence \boxed 5.", "integer") == "5"


def test_tagged_beats_boxed_and_label():
    text = r"The answer is 4. \boxed{5} <answer>6</answer>"
    assert extract_answer(text, "integer") == "6"


def test_boxed_beats_label():
    assert extract_answer(r"The answer is 4. Check: \boxed{5}", "integer") == "5"


@pytest.mark.parametrize("text, expected", [
    ("Reasoning...\nThe answer is (C).", "C"),
    ("so the answer is D", "D"),
    ("Answer: B", "B"),
    ("Final answer: (E)", "E"),
    ("**Answer:** (J)", "J"),
    ("**Answer**: H", "H"),
    ("THE ANSWER IS (G)", "G"),
    ("The correct answer is C) 12 m/s", "C"),
    ("The answer is C. Because it holds.", "C"),
    ("Answer: option d", "D"),
    ("the answer is (a)", "A"),
    (r"The answer is $\boxed{\text{(F)}}$", "F"),
    ("<answer> I </answer>", "I"),
])
def test_mcq_labelled_variants(text, expected):
    assert extract_answer(text, "mcq_letter") == expected


def test_mcq_several_answers_last_wins():
    text = "Maybe the answer is (A).\nOn reflection, the answer is (B).\nNo wait, the answer is (H)."
    assert extract_answer(text, "mcq_letter") == "H"


def test_mcq_skips_labels_that_hold_no_letter():
    text = "Answer: Let's think step by step. A is wrong since ... The answer is (D). The answer is unknown."
    assert extract_answer(text, "mcq_letter") == "D"


@pytest.mark.parametrize("text", [
    "I think B is plausible but A could also work.",
    "The answer is (Cannot be determined).",
    "The answer is a function of temperature.",
    "The answer is (311.9%).",
    "Options A and C are both partially right, so it depends.",
])
def test_mcq_does_not_guess_stray_letters(text):
    assert extract_answer(text, "mcq_letter") is None


@pytest.mark.parametrize("text", ["Long reasoning about A and B.\n\nC", "reasoning\n(C)", "reasoning\n**C.**"])
def test_mcq_final_bare_letter_line(text):
    assert extract_answer(text, "mcq_letter") == "C"


def test_mcq_ten_options():
    prompt = mcq_prompt("Which?", [f"option {i}" for i in range(10)])
    assert "J. option 9" in prompt
    for letter in LETTERS[:10]:
        assert grade(f"Thinking.\nThe answer is ({letter}).", letter, "mcq_letter") == (letter, True)
    assert grade("The answer is (J).", "I", "mcq_letter") == ("J", False)
    assert extract_answer("The answer is (K).", "mcq_letter") is None  # only A-J exist


def test_mcq_case_insensitive_gold():
    assert grade("The answer is (c)", "C", "mcq_letter") == ("C", True)
    assert grade("The answer is C", "c", "mcq_letter") == ("C", True)


@pytest.mark.parametrize("text, expected", [
    ("The answer is 018", "18"),
    ("Final answer: $1,000", "1000"),
    ("Answer: 42 apples", "42"),
    ("the answer is 18.0.", "18"),
    (r"Answer: \frac{36}{2}", "18"),
    (r"The answer is $\$1{,}250$.", "1250"),
    ("The answer is 45 degrees.", "45"),
])
def test_integer_extraction(text, expected):
    assert extract_answer(text, "integer") == expected


@pytest.mark.parametrize("text, expected", [
    ("We add 3 and 4 to get 7, then double: **14**", "14"),
    ("The total cost is $1,234.", "1234"),
    ("so x is -12", "-12"),
    ("the range is 3-5", "5"),
    (r"it comes to $2.50$", "2.5"),
])
def test_last_number_fallback(text, expected):
    assert extract_answer(text, "integer") == expected


def test_prose_after_label_is_not_an_answer():
    text = "Answer: Let's think step by step. Doubling 12 gives 24, and 24 + 3 = 27."
    assert extract_answer(text, "math_expression") == "27"
    assert extract_answer(text, "integer") == "27"


def test_dollar_sign_inside_inline_math():
    text = r"The answer is $\$1{,}250$ in total."
    assert extract_answer(text, "math_expression") == r"\$1{,}250"
    assert grade(text, "1250", "math_expression") == (r"\$1{,}250", True)


def test_no_number_no_answer():
    assert extract_answer("I cannot solve this.", "integer") is None
    assert grade("I cannot solve this.", "7", "integer") == (None, False)


@pytest.mark.parametrize("text, expected", [
    (r"The answer is $\frac{3}{4}$.", r"\frac{3}{4}"),
    ("The answer is 42. Done.", "42"),
    (r"Final answer: \(x = 2\)", "x = 2"),
    (r"**Answer:** $\sqrt{3}$", r"\sqrt{3}"),
])
def test_math_labelled(text, expected):
    assert extract_answer(text, "math_expression") == expected


# ------------------------------------------------------------------------------------------------ grading
@pytest.mark.parametrize("pred, gold", [
    ("018", "18"),
    ("1,000", "1000"),
    ("18.0", "18"),
    ("-7", "-7"),
])
def test_integer_equal(pred, gold):
    assert grade(f"The answer is {pred}", gold, "integer")[1]


@pytest.mark.parametrize("pred, gold", [("17", "18"), ("1.5", "1"), ("180", "18")])
def test_integer_not_equal(pred, gold):
    assert not grade(f"The answer is {pred}", gold, "integer")[1]


@pytest.mark.parametrize("pred, gold", [
    (r"\dfrac{1}{2}", "0.5"),
    (r"\tfrac12", r"\frac{1}{2}"),
    (r"\left( 3, \frac{\pi}{2} \right)", r"(3,\frac{\pi}{2})"),
    (r"10\%", "10"),
    ("[2,5)", "[2, 5)"),
    (r"[\frac{4}{2}, 5)", "[2,5)"),
    (r"(-\infty, 3]", r"(-\infty,3]"),
    ("x=3", "3"),
    (r"x \in [2,5)", "[2,5)"),
    (r"90^\circ", "90"),
    (r"90^{\circ}", "90"),
    ("30 degrees", "30"),
    (r"12\text{ cm}^2", "12"),
    (r"\$18.90", "18.9"),
    ("5 dollars", "5"),
    (r"\text{Evelyn}", "Evelyn"),
    ("4.", "4"),
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}"),
    (r"\sqrt[3]{8}", "2"),
    (r"2\sqrt{3}", r"\sqrt{12}"),
    ("2x+3y", "3y+2x"),
    ("x^2+2x+1", "(x+1)^2"),
    (r"\frac{\pi}{4}", r"\pi/4"),
    ("-2, 1", "1,-2"),
    (r"1 \! 000", "1000"),
    (".5", "0.5"),
    (r"\{1,2\}", r"\{1,2\}"),
    (r"(-\infty,-1)\cup(1,\infty)", r"(-\infty,-1) \cup (1, \infty)"),
])
def test_math_equivalent(pred, gold):
    assert math_equal(pred, gold)
    assert grade(rf"so \boxed{{{pred}}}", gold, "math_expression")[1]


@pytest.mark.parametrize("pred, gold", [
    ("[2,5)", "[2,5]"),
    ("(2,5)", "[2,5)"),
    (r"(3,\frac{\pi}{2})", r"(\frac{\pi}{2},3)"),
    ("3.14", r"\pi"),
    ("0.333", r"\frac{1}{3}"),
    ("2x", "3x"),
    ("1,2", "1,2,3"),
    (r"\sqrt{2}", "2"),
    (r"\text{Evelyn}", "Devon"),
    ("", "0"),
])
def test_math_not_equivalent(pred, gold):
    assert not math_equal(pred, gold)


def test_normalize_math():
    assert normalize_math(r"\left( \dfrac{1}{2}, 3 \right)") == r"(\frac{1}{2},3)"
    assert normalize_math(r"\text{x} = 5\text{ cm}.") == "5"


@pytest.mark.parametrize("pathological", [
    r"2^{2^{2^{2^{100}}}}",
    r"10^{10^{10}}",
    r"9^{99999999}",
    r"\frac{" * 50 + "1" + "}{2}" * 50,
    "1+" * 5000 + "1",
    "(a+b+c+d+e+f+g+h)^{100}",
    "((10^{30})^{100})^{100}",
    "__import__('os').system('echo pwned')",
])
def test_sympy_is_bounded_and_safe(pathological):
    """Bounded by the grading worker (math-verify's parser has no bound of its own: 50 nested \\frac take minutes)."""
    start = time.perf_counter()
    assert not bounded.agree(pathological, "5", "math_expression", bounded.Budget(budget_ms=500))
    assert time.perf_counter() - start < 10


def test_unparseable_latex_does_not_crash():
    assert not math_equal(r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix} 1 \\ 3 \end{pmatrix}")
    assert math_equal(r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}")


def test_grade_returns_extracted_even_when_wrong():
    assert grade(r"\boxed{\frac{1}{3}}", "0.5", "math_expression") == (r"\frac{1}{3}", False)


# ------------------------------------------------------------------------------ JSON answers (ZeroEval prompts)
ZE_REPLY = ('```json\n{\n    "reasoning": "16 - 3 - 4 = 9 eggs, 9 * 2 = 18. The answer is 20? No.",\n'
            '    "answer": "18"\n}\n```')


def test_json_answer_beats_labels_and_fences():
    assert extract_answer(ZE_REPLY, "integer") == "18"
    assert grade(ZE_REPLY, "18", "integer") == ("18", True)
    # trailing text after the object, a bare number, no fence
    assert extract_answer('{"reasoning": "x", "answer": 42}\nHope this helps! The answer is 7.', "integer") == "42"


@pytest.mark.parametrize("text, expected", [
    ('{"reasoning": "r", "answer": "\\\\frac{1}{2}"}', r"\frac{1}{2}"),  # properly escaped LaTeX
    ('{"reasoning": "r", "answer": "\\frac{1}{2}"}', r"\frac{1}{2}"),    # \f not a form feed: a LaTeX command
    ('{"reasoning": "r", "answer": "3\\sqrt{2}"}', r"3\sqrt{2}"),        # invalid JSON escape kept as written
    ("{'reasoning': 'r', 'answer': '5'}", "5"),                           # Python-dict style quotes
    ('{"answer": "x = 5"}', "x = 5"),
])
def test_json_answer_tolerant_parsing(text, expected):
    assert extract_answer(text, "math_expression") == expected


def test_json_answer_last_object_wins_and_placeholder_is_skipped():
    text = '{"reasoning": "r", "answer": "12"}\nWait, correction:\n{"reasoning": "r2", "answer": "13"}'
    assert extract_answer(text, "integer") == "13"
    # a copied template placeholder is no number: the next stage decides
    assert extract_answer('{"reasoning": "...", "answer": "___"} so \\boxed{7}', "integer") == "7"


def test_json_answer_with_apostrophe_in_double_quoted_value():
    text = '{"reasoning": "it\'s 2", "answer": "it\'s"}'
    assert extract_answer(text, "python_literal") == "it's"


def test_math_json_answer_equivalence_and_base_subscript():
    assert grade('{"answer": "0.5"}', r"\frac{1}{2}", "math_expression")[1]
    assert grade('{"answer": "1112112₃"}', "1112112_3", "math_expression")[1]  # unicode subscript base
    assert not grade('{"answer": "12 or 13"}', "12", "math_expression")[1]  # not "first number equal"


# ------------------------------------------------------------------------------ CRUXEval outputs (python_literal)
@pytest.mark.parametrize("answer, gold", [
    ('[1,2]', "[1, 2]"),                                   # spacing
    ('{"l": 1, "t": 2}', "{'l': 1, 't': 2}"),              # JSON-style quotes, same dict
    ("{3: 'A3', 1: 'A1'}", "{1: 'A1', 3: 'A3'}"),          # dict order does not matter (==)
    ("8.50", "8.5"),
    ("'nada'", "'nada'"),
    ("nada", "'nada'"),                                    # the JSON string field holds the string itself
    ("     7     ", "'     7     '"),                      # outer spaces of a string output are kept
    ("t\\nZA", "'t\\nZA'"),                                # the gold's source text between its quotes
    ("True", "True"),
    ("(1, 'a')", "(1, 'a')"),
])
def test_python_literal_equal(answer, gold):
    text = '{"reasoning": "r", "answer": ' + json.dumps(answer) + "}"
    extracted, correct = grade(text, gold, "python_literal")
    assert correct, (extracted, gold)


@pytest.mark.parametrize("answer, gold", [
    ("[1, 2, 3]", "[1, 2]"),
    ("7", "'     7     '"),                                # spaces matter in a string output
    ("'abc'", "'abd'"),
    ("[1, 2", "[1, 2]"),                                   # no literal, different text
    (")'", "')'"),
])
def test_python_literal_not_equal(answer, gold):
    text = '{"reasoning": "r", "answer": ' + json.dumps(answer) + "}"
    assert not grade(text, gold, "python_literal")[1]


def test_python_literal_edge_forms():
    assert grade('{"reasoning": "r", "answer": ""}', "''", "python_literal") == ('""', True)  # the empty string
    assert grade('{"answer": [1, 2, 3]}', "[1, 2, 3]", "python_literal")[1]  # a JSON list, not a string
    assert grade('{"answer": true}', "True", "python_literal")[1]  # JSON true is Python's True
    assert grade("The output is:\n```python\nassert f('a') == [1, 2]\n```\nAnswer: assert f('a') == [1, 2]",
                 "[1, 2]", "python_literal")[1]
    # nothing labelled: no literal is guessed from the reasoning
    assert grade("f returns [1, 2] I think", "[1, 2]", "python_literal") == (None, False)


def test_runaway_digits_are_no_answer():
    assert extract_answer("9" * 5000, "integer") is None


# ------------------------------------------------------------------------------------------ degenerate answers
@pytest.mark.parametrize("answer", ["∞", "infinity", "Infinity", "-inf", "NaN", r"1-\infty", r"\tan(\frac{\pi}{2})",
                                    r"\frac{x}{x-x}", "1, \\infty", r"\{1\} \cup (1, \frac{1}{0})"])
def test_degenerate_answers_in_any_form_are_no_answer(answer):
    assert grading.math_degenerate(answer)
    assert extract_answer(rf"Tried 2 ways. The answer is ${answer}$", "math_expression") is None
    assert not math_equal(answer, answer)


def test_magnitude_bound_sits_at_10_to_the_300():
    edge, beyond = "1" + "0" * 300, "1" + "0" * 301
    assert math_equal(edge, edge) and grade(rf"\boxed{{{edge}}}", edge, "integer") == (edge, True)
    assert not math_equal(beyond, beyond) and grade(rf"\boxed{{{beyond}}}", beyond, "integer") == (None, False)
    assert math_equal(r"\frac{10^{100}}{2}", "5\\cdot 10^{99}") and not math_equal("(10^{99})^{4}", "(10^{99})^{4}")


def test_literal_with_a_non_finite_float_is_no_answer():
    assert not literal_equal("1e999", "1e400") and not literal_equal("[1e999]", "[1e999]")
    assert not literal_equal("inf", "inf") and literal_equal("'inf'", "'inf'")  # the string 'inf' is a value
    assert grade('{"answer": {"a": -1e999}}', "{'a': -1e999}", "python_literal") == (None, False)
    assert grade('{"answer": [1, 2.5]}', "[1, 2.5]", "python_literal")[1]
