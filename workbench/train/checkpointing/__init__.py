"""The parts of a training checkpoint: file names and listing (`files`), the payload and
its checks (`payload`), atomic writes (`write`), run ids and the folders a run owns
(`runs`). `workbench.train.checkpoints` reads and verifies them and exports every name."""
