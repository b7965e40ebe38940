"""Imported once by the grading workers' forkserver (pipeline/collect/bounded.py): math-verify imports sympy, antlr
and its LaTeX grammar, and sympy imports parts of itself on first use (0.5 s for the first product of a sum), so the
first comparison of every fresh worker would spend its budget importing. Grading a few answers here makes every
worker forked from that server start warm."""
from pipeline.collect.grading import extract_answer, math_equal

for _a, _b in ((r"\frac{1}{2}", "0.5"), (r"2\sqrt{2}", r"\sqrt{8}"), (r"3 + 2\sqrt{2}", r"(1+\sqrt{2})^2"),
               ("2x+1", "1+2x"), (r"\pi/2", r"\frac{\pi}{2}"), (r"e^{2}", r"\exp(2)"), (r"\tan(1)", r"\sin(1)"),
               (r"(-\infty, 2]", r"(-\infty, 2]"), (r"\{1, 2\}", "1, 2"), (r"\csc(0)", "1")):
    math_equal(_a, _b)
extract_answer(r"The answer is $\frac{36}{2}$", "integer")
