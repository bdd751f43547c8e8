"""TODO capacity"""
