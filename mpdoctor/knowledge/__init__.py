"""Compatibility knowledge with its sources: GPU architectures, CUDA and driver floors,
library pins (tables/), version comparison, dtypes, units and signals. Imports nothing
else of mpdoctor; derivers and checks share it."""
