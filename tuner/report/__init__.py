"""TODO report"""
