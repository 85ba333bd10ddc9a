"""The ASR workload's data pipeline: manifests and audio (`manifests`: reading a corpus, loading
audio, duration-bucketed sharded batch plans), a corpus's batches with their features computed,
cached and prefetched (`corpus`, `batch`, `pipeline`, `heap`) or prepared in worker processes
(`worker_batches`), and the formats a corpus is stored in besides a manifest: precomputed feature
shards (`feature_shards`) and audio shards at a folder or an S3 URI (`audio_shards`, streamed by
`shard_stream`, unpacked by `tar_stream`)."""
