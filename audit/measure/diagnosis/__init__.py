"""Which known mistake a wrong result matches: diagnosis (the output's and the gradients'), lse_diagnosis
(the log-sum-exp's), mistake_memo (each mistake's output computed once per input set)."""
