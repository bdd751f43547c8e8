"""TODO study"""
