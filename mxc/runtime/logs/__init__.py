"""Reading what a training wrote: its log's step lines (``trainlog``), what ``mxc logs`` shows
(``logview``) and its metrics as one line per step across attempts (``metrics_merge``)."""
