"""TODO sim/http"""
