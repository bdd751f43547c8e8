"""TODO trial"""
