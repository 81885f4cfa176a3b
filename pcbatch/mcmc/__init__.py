"""MCMC samplers written for one chain and autobatched across chains."""
from pcbatch.mcmc import adaptation, diagnostics, nuts
from pcbatch.mcmc.nuts import NUTSInfo, NUTSOutput, sample

__all__ = ["NUTSInfo", "NUTSOutput", "adaptation", "diagnostics", "nuts", "sample"]
