"""What every benchmark in bench/ shares, once: the statistics of a comparison (`stats`: contenders
interleaved, median and IQR, a ratio called a win only outside the noise), the results they write
(`results`: JSON with a verdict beside a PNG, the commit measured), the fault every contender gets
(`stats.sigkill`) and the Ray Train baseline (`ray_train`: one `TorchTrainer` loop whose plan says
when it stops, evaluates, checkpoints and what it counts). The cluster helpers shared with the
tests (waiting on a condition, what a run left on a cluster, a local S3 API) are in
`orchestrator/testing/`."""
