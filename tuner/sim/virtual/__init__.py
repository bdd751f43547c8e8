"""TODO sim/virtual"""
