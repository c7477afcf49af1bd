"""What every emulated instance runs on: the modelled clock, framed channels, the process base."""
