"""What the kit's scripts share: the device (MPDOCTOR_KIT_DEVICE: cuda or cpu) and the
size (MPDOCTOR_KIT_SMALL=1 for the CPU dry run)."""

import os

import torch

DEVICE = os.environ.get("MPDOCTOR_KIT_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
SMALL = os.environ.get("MPDOCTOR_KIT_SMALL") == "1"
OUT = os.environ.get("MPDOCTOR_KIT_OUT", ".")
