"""The semantic model every rule reads: what the code's names and values are.

Below the engine and the rules, importing neither: qualified names through every alias
(`names`), loops and training steps (`loops`), kinds of values from evidence (`kinds`),
symbolic shapes (`shapes`), dataflow within a function (`flow`), GEMM recognition in every
spelling (`torch_api`), and the shared pattern helpers of the layout and fused families
(`layout`, `pointwise`). Each analysis is built once per file, on first use.
"""
