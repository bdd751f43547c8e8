"""TODO search"""
