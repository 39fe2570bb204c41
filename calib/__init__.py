"""Calibration harness: real forward passes over a paged KV cache, timed on a real device.

Needs the ``calib`` extra (torch). The simulator reads calib's tables as files and never
imports this package.
"""
